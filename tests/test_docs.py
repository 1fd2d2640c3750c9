"""The docs name only what exists: every repository path and every backticked class or dotted name
in docs/ARCHITECTURE.md and README.md, checked against the tree and against the source with
`ast` (nothing is imported, so this runs in a fraction of a second).

Paths: a token made of `/`-separated names that ends in .py, .md, .yaml or .sh, or ends with `/`
(a folder), or a backticked one with a `/` and no extension, must exist relative to the
repository root, to jaxserve/ (`core/loop.py`) or to pallas_kernels/ (`greedy_sample/gpu.py`),
as ARCHITECTURE.md says; a bare file name (`builtin.py`) must be some file's name. Not paths:
absolute ones (`/v1/completions`, `/path/to/ckpt`), URLs, `~/...`, and a folder right after a
command-line flag (`--result-dir results/`, the user's). `*` is a glob and a one-capital-letter
name a placeholder (`configs/X.yaml`): at least one file must match. A link's `#anchor` must be a
heading of the file it points to.

Symbols, in backticks outside code blocks: a CamelCase name (`ScheduledBatch`) or a call
(`step()`) must be a class, def or assignment somewhere in jaxserve/, pallas_kernels/ or
investigations/; a dotted name must resolve: `Class.member[.member]` through the members of the
class and its bases (defs, class-level fields, `self.x` assignments; a member annotated with a
class leads on to that class's members), `module.name` or `package/module.name` through a module
(matched by the end of its dotted name) and what it defines at top level, or a config key
(`server.max_waiting_requests`: EngineConfig's fields). FOREIGN lists the few names from other
projects.

ARCHITECTURE.md's package layout states each package's layer; it must match
tests/architecture/test_layers.py's LAYERS.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.architecture.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/ARCHITECTURE.md", "README.md")
SOURCES = ("jaxserve", "pallas_kernels", "investigations")
BASES = (ROOT, ROOT / "jaxserve", ROOT / "pallas_kernels")  # where a relative path may start

# Names from other projects, named in backticks by the docs (keep this short: it is not for
# names of this project).
FOREIGN = frozenset(
  {
    "jax.jit",
    "jax.ShapeDtypeStruct",
    "jax.distributed.initialize",  # JAX
    "RemoteTokenizer",  # lm-evaluation-harness
    "message.tool_calls",
    "delta.tool_calls",  # OpenAI API fields
    "message.reasoning_content",
    "delta.reasoning_content",  # vLLM's
    "stream_options.include_usage",
  }
)

FILE_EXTENSIONS = (".py", ".md", ".yaml", ".sh")
PATH_TOKEN = re.compile(r"(?<![\w/.~:*-])(?:[\w.*-]+/)+(?:[\w.*-]*[\w*])?")
BARE_FILE = re.compile(r"(?<![\w/.~:*-])[\w-]+\.(?:py|md|yaml|sh)(?![\w/-])")
FLAG_BEFORE = re.compile(r"--[\w-]+[ =]$")
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`]+)`")  # a span may go on over a line break
NAME = re.compile(r"([A-Za-z_]\w*(?:[./][A-Za-z_]\w*)*)(\(.*\))?")
CAMEL = re.compile(r"[A-Z]\w*[a-z]\w*")
LINK = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")
PLACEHOLDER = re.compile(r"[A-Z](?=\.|$)")


# -- the source ------------------------------------------------------------------------------------
def _module_name(path: Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _assigned(node: ast.AST) -> list[tuple[str, ast.expr | None]]:
  """(name, annotation) of what a statement binds: a def, a class, an assignment."""
  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
    return [(node.name, node.returns)]
  if isinstance(node, ast.ClassDef):
    return [(node.name, None)]
  if isinstance(node, ast.Assign):
    return [(t.id, None) for t in node.targets if isinstance(t, ast.Name)]
  if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
    return [(node.target.id, node.annotation)]
  return []


class Source:
  """What jaxserve/, pallas_kernels/ and investigations/ define."""

  def __init__(self, roots: tuple[str, ...] = SOURCES):
    self.modules: dict[str, ast.Module] = {}
    for root in roots:
      for path in sorted((ROOT / root).rglob("*.py")):
        self.modules[_module_name(path)] = ast.parse(path.read_text(), str(path))
    self.classes: dict[str, list[ast.ClassDef]] = {}
    self.defined: set[str] = set()
    for tree in self.modules.values():
      for node in ast.walk(tree):
        self.defined.update(name for name, _ in _assigned(node))
        if isinstance(node, ast.ClassDef):
          self.classes.setdefault(node.name, []).append(node)

  def members(
    self, cls: ast.ClassDef, seen: frozenset[str] = frozenset()
  ) -> dict[str, ast.expr | None]:
    """A class's members (and its bases' found here): name -> annotation."""
    found: dict[str, ast.expr | None] = {}
    for base in cls.bases:
      name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
      for parent in self.classes.get(name, ()):
        if parent.name not in seen:
          found.update(self.members(parent, seen | {cls.name}))
    for node in ast.walk(cls):
      targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AnnAssign)
        else []
      )
      for target in targets:
        if (
          isinstance(target, ast.Attribute)
          and isinstance(target.value, ast.Name)
          and target.value.id == "self"
        ):
          found.setdefault(target.attr, getattr(node, "annotation", None))
    for node in cls.body:
      found.update(_assigned(node))
    return found

  def types_of(self, annotation: ast.expr | None) -> list[str]:
    """The classes of this source an annotation names (`ServerConfig`, `X | None`)."""
    if annotation is None:
      return []
    names = [
      n.id
      if isinstance(n, ast.Name)
      else n.attr
      if isinstance(n, ast.Attribute)
      else n.value
      if isinstance(n, ast.Constant) and isinstance(n.value, str)
      else None
      for n in ast.walk(annotation)
    ]
    return [n for n in names if n in self.classes]

  def resolves_in_class(self, classes: list[ast.ClassDef], rest: list[str]) -> bool:
    if not rest:
      return True
    for cls in classes:
      members = self.members(cls)
      if rest[0] in members:
        if len(rest) == 1:
          return True
        if any(
          self.resolves_in_class(self.classes[t], rest[1:]) for t in self.types_of(members[rest[0]])
        ):
          return True
    return False

  def resolves_in_module(self, tree: ast.Module, rest: list[str]) -> bool:
    for node in tree.body:
      for name, annotation in _assigned(node):
        if name != rest[0]:
          continue
        if len(rest) == 1:
          return True
        if isinstance(node, ast.ClassDef) and self.resolves_in_class([node], rest[1:]):
          return True
        if any(
          self.resolves_in_class(self.classes[t], rest[1:]) for t in self.types_of(annotation)
        ):
          return True
    return False

  def modules_ending(self, parts: list[str]) -> list[ast.Module]:
    return [tree for name, tree in self.modules.items() if name.split(".")[-len(parts) :] == parts]

  def resolves(self, dotted: str) -> bool:
    """Whether a dotted name (`Class.member`, `module.name`, `pkg/module.name`, a config key)
    names something defined here."""
    parts = re.split(r"[./]", dotted)
    if parts[0] in self.classes and self.resolves_in_class(self.classes[parts[0]], parts[1:]):
      return True
    for k in range(len(parts), 0, -1):
      for tree in self.modules_ending(parts[:k]):
        if k == len(parts) or self.resolves_in_module(tree, parts[k:]):
          return True
    return self.resolves_in_class(self.classes.get("EngineConfig", []), parts)


@functools.cache
def source() -> Source:
  return Source()


# -- the docs --------------------------------------------------------------------------------------
def path_tokens(text: str) -> list[str]:
  """Every repository path the text names (see the module docstring)."""
  found = []
  for match in PATH_TOKEN.finditer(text):
    token = match.group()
    line_start = text.rfind("\n", 0, match.start()) + 1
    if token.endswith("/"):
      if FLAG_BEFORE.search(text[line_start : match.start()]):
        continue  # a command's argument: the user's folder
      found.append(token)
    elif token.endswith(FILE_EXTENSIONS):
      found.append(token)
  found += BARE_FILE.findall(text)
  for span in spans(text):
    if "/" in span and re.fullmatch(r"[\w.*-]+(?:/[\w.*-]+)+", span) and "." not in span:
      found.append(span)  # a backticked path without an extension: a file or a folder
  return found


def path_exists(token: str) -> bool:
  if "/" not in token:
    return any(p.is_file() for p in ROOT.rglob(token) if ".git" not in p.parts)
  pattern = "/".join(PLACEHOLDER.sub("*", part) for part in token.rstrip("/").split("/"))
  for base in BASES:
    matches = list(base.glob(pattern)) if "*" in pattern else [base / pattern]
    if any(m.is_dir() if token.endswith("/") else m.exists() for m in matches):
      return True
  parts = tuple(token.rstrip("/").split("/"))  # a path within a listed folder: gpu/write.py
  if token.endswith("/") or "*" in pattern:
    return False
  return any(
    p.parts[-len(parts) :] == parts for p in ROOT.rglob(parts[-1]) if ".git" not in p.parts
  )


def _without_fences(text: str) -> str:
  return FENCE.sub("", text)


def spans(text: str) -> list[str]:
  """The text's backticked spans outside code blocks, each on one line."""
  return [" ".join(span.split()) for span in SPAN.findall(_without_fences(text))]


def symbol_names(text: str) -> list[str]:
  """The backticked names the text says are this project's (see the module docstring)."""
  found = []
  for span in spans(text):
    match = NAME.fullmatch(span)
    if match is None:
      continue
    name, call = match.groups()
    if name.endswith(FILE_EXTENSIONS) or ("/" in name and "." not in name):
      continue  # a path
    if "." in name or CAMEL.fullmatch(name) or call:
      found.append(name)
  return found


def symbol_exists(name: str) -> bool:
  if name in FOREIGN:
    return True
  if "." in name:
    return source().resolves(name)
  return name in source().defined


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_anchors(doc: Path) -> list[str]:
  text = doc.read_text()
  broken = []
  for target, anchor in LINK.findall(text):
    linked = doc if not target else doc.parent / target
    if not linked.is_file():
      continue  # the path check reports it
    headings = re.findall(r"^#+ (.+)$", _without_fences(linked.read_text()), re.MULTILINE)
    if anchor not in {_slug(h) for h in headings}:
      broken.append(f"{target}#{anchor}")
  return broken


def problems(text: str) -> list[str]:
  """The paths and names in `text` that do not exist."""
  return [f"path {t}" for t in path_tokens(text) if not path_exists(t)] + [
    f"symbol {s}" for s in symbol_names(text) if not symbol_exists(s)
  ]


# -- the tests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("doc", DOCS)
def test_the_docs_name_only_what_exists(doc):
  assert sorted(set(problems((ROOT / doc).read_text()))) == []


@pytest.mark.parametrize("doc", DOCS)
def test_every_anchor_is_a_heading(doc):
  assert broken_anchors(ROOT / doc) == []


def test_the_checks_see_the_docs():
  """Not vacuous: the architecture names many paths and symbols, each of them checked."""
  text = (ROOT / "docs/ARCHITECTURE.md").read_text()
  paths, symbols = set(path_tokens(text)), set(symbol_names(text))
  assert len(paths) > 80 and len(symbols) > 80
  assert {"core/loop.py", "pallas_kernels/ragged_paged_attention/reference.py", "engine/"} <= paths
  assert {
    "EngineCore.add_request",
    "CoreClient.add",
    "ScheduledBatch",
    "server.max_waiting_requests",
  } <= symbols


def test_every_foreign_name_is_used():
  """The allowlist only holds names the docs use (and none of this project's)."""
  used = {name for doc in DOCS for name in symbol_names((ROOT / doc).read_text())}
  assert FOREIGN <= used
  assert not {name for name in FOREIGN if "." not in name and name in source().defined}


def test_the_checks_catch_what_does_not_exist():
  text = (
    "See `EngineCore.add_request`, `EngineCore.fly()`, `NoSuchRunner`, `no_such_fn()`,\n"
    "`core/loop.NoLoop`, `server.max_waiting_request` and `CoreClient.stats.num_running`,\n"
    "core/loop.py, core/nowhere.py, docs/NOPE.md, `pallas_kernels/no_kernel`, engine/,\n"
    "nothing/, builtin.py and nowhere.py; --out-dir results/ and /v1/completions pass.\n"
  )
  assert sorted(problems(text)) == [
    "path core/nowhere.py",
    "path docs/NOPE.md",
    "path nothing/",
    "path nowhere.py",
    "path pallas_kernels/no_kernel",
    "symbol EngineCore.fly",
    "symbol NoSuchRunner",
    "symbol core/loop.NoLoop",
    "symbol no_such_fn",
    "symbol server.max_waiting_request",
  ]
  assert symbol_exists("CoreClient.stats.num_running")  # stats: EngineStats, a field of it
  assert not symbol_exists("CoreClient.stats.num_flying")


def test_anchor_check_catches_a_missing_heading(tmp_path):
  doc = tmp_path / "doc.md"
  doc.write_text("# Title\n## Some part\n[a](#some-part) [b](#no-part)\n")
  assert broken_anchors(doc) == ["#no-part"]


def layout_layers() -> dict[str, int]:
  """ARCHITECTURE.md's package layout: package -> layer, as LAYERS names packages."""
  text = (ROOT / "docs/ARCHITECTURE.md").read_text()
  section = text.split("## Package layout", 1)[1].split("\n## ", 1)[0]
  block = section.split("```", 2)[1]
  layers = {}
  for match in re.finditer(r"^ ?(\d{1,2})  ([^\s,]+(?:, [^\s,]+)*)", block, re.MULTILINE):
    for name in match.group(2).split(", "):
      if name == "__init__.py":
        package = "jaxserve"
      elif name == "pallas_kernels/":
        package = "pallas_kernels"
      else:
        package = "jaxserve." + name.removesuffix("/").removesuffix(".py")
      layers[package] = int(match.group(1))
  return layers


def test_the_layout_states_the_layers():
  assert layout_layers() == {
    package: i for i, packages in enumerate(LAYERS) for package in packages
  }
