"""One request record across the wire: engine/core_io.EngineCoreRequest is built in one place,
engine/core_io.new_core_requests (where a prompt's ids become one checked tuple), and no module
copies a record's prompt ids into a list (`list(x.prompt_token_ids)`; `tuple()` of the tuple is
the tuple itself)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_graph import PACKAGE, ROOT, parse

RECORD = "EngineCoreRequest"
RECORD_SITE = PACKAGE / "engine" / "core_io.py"


def request_records(path: Path) -> list[str]:
  """Where module `path` builds a request record (a call of EngineCoreRequest) or copies a
  record's prompt ids into a list."""
  found = []
  for node in ast.walk(parse(path)):
    if not isinstance(node, ast.Call):
      continue
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name == RECORD:
      found.append(f"{path}:{node.lineno} {RECORD}(...)")
    elif name == "list" and any(
      isinstance(a, ast.Attribute) and a.attr == "prompt_token_ids" for a in node.args
    ):
      found.append(f"{path}:{node.lineno} list(.prompt_token_ids)")
  return found


def test_the_request_record_has_one_construction_site():
  found = {
    str(path.relative_to(ROOT)): request_records(path)
    for scope in (PACKAGE, ROOT / "investigations", ROOT / "scripts")
    for path in sorted(scope.rglob("*.py"))
  }
  site = str(RECORD_SITE.relative_to(ROOT))
  assert [f.rsplit(" ", 1)[1] for f in found.pop(site)] == [f"{RECORD}(...)"]
  assert {p: f for p, f in found.items() if f} == {}
  tree = parse(RECORD_SITE)
  (builder,) = [
    n
    for n in ast.walk(tree)
    if isinstance(n, ast.FunctionDef)
    and any(getattr(c.func, "id", None) == RECORD for c in ast.walk(n) if isinstance(c, ast.Call))
  ]
  assert builder.name == "new_core_requests"


def test_the_record_rule_catches_what_it_is_for(tmp_path):
  source = tmp_path / "client.py"
  source.write_text(
    "def send(spec, core_io):\n"
    "  a = EngineCoreRequest(spec.request_id, list(spec.prompt_token_ids))\n"
    "  b = core_io.EngineCoreRequest(spec.request_id, spec.prompt_token_ids)\n"
    "  return tuple(spec.prompt_token_ids), len(spec.prompt_token_ids)\n"
  )
  assert sorted(f.rsplit(":", 1)[1] for f in request_records(source)) == [
    "2 EngineCoreRequest(...)",
    "2 list(.prompt_token_ids)",
    "3 EngineCoreRequest(...)",
  ]
