"""No family flag outside the family modules (jaxserve/models/families/): nothing else reads a
family attribute (`config.gemma`), compares or looks up a config's `architecture`, or compares
with (or keys a table by) a family's name, model type or Hugging Face architecture name (the
names are read from the families' `ModelFamily(...)` records); a family's specifics are its
module's choices."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_graph import KERNELS, PACKAGE, ROOT, parse

FAMILIES = PACKAGE / "models" / "families"
FAMILY_SCOPE = (PACKAGE, KERNELS, ROOT / "investigations", ROOT / "scripts")


def family_names(families: Path = FAMILIES) -> frozenset[str]:
  """Every family's name, model types and HF architecture names, from the string literals of
  the `ModelFamily(name=..., architectures={...})` calls of the family modules."""
  names = set()
  for path in families.glob("*.py"):
    for node in ast.walk(parse(path)):
      if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ModelFamily":
        for keyword in node.keywords:
          if keyword.arg in ("name", "architectures"):
            names |= {
              n.value
              for n in ast.walk(keyword.value)
              if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
  return frozenset(names)


def _is_architecture(node: ast.AST) -> bool:
  return (isinstance(node, ast.Attribute) and node.attr == "architecture") or (
    isinstance(node, ast.Name) and node.id == "architecture"
  )


def _names_in(node: ast.AST, names: frozenset[str]) -> bool:
  """A family name as a string constant, or among the elements of a tuple, list or set."""
  elements = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
  return any(isinstance(e, ast.Constant) and e.value in names for e in elements)


def family_flags(path: Path, names: frozenset[str]) -> list[str]:
  """Where module `path` decides by family: `.gemma` (or another family's name as an
  attribute), a comparison or lookup of `architecture`, a comparison with a family's name, a
  table keyed by family names."""
  found = []
  attributes = {name for name in names if name.islower()}  # not transformers' classes
  for node in ast.walk(parse(path)):
    where = f"{path}:{getattr(node, 'lineno', 0)}"
    if isinstance(node, ast.Attribute) and node.attr in attributes:
      found.append(f"{where} .{node.attr}")
    elif isinstance(node, ast.Compare):
      operands = [node.left, *node.comparators]
      if any(_is_architecture(o) or _names_in(o, names) for o in operands):
        found.append(f"{where} comparison")
    elif isinstance(node, ast.Subscript) and _is_architecture(node.slice):
      found.append(f"{where} [architecture]")
    elif isinstance(node, ast.Call) and any(_is_architecture(a) for a in node.args):
      if isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        found.append(f"{where} .get(architecture)")
    elif isinstance(node, ast.Dict) and any(k and _names_in(k, names) for k in node.keys):
      found.append(f"{where} table keyed by family")
  return found


# Modules whose keys happen to spell a family's name but choose something else: vLLM's reasoning
# parsers are named "qwen3" and "deepseek_r1", and a Qwen3 model may run either.
NAMES_NOT_FAMILIES = frozenset({PACKAGE / "reasoning" / "__init__.py"})


def test_no_family_flag_outside_the_family_modules():
  names = family_names()
  assert {"llama", "MistralForCausalLM", "gemma3_text", "qwen3_moe", "MixtralForCausalLM"} <= names
  paths = [
    path
    for scope in FAMILY_SCOPE
    for path in sorted(scope.rglob("*.py"))
    if FAMILIES not in path.parents and path not in NAMES_NOT_FAMILIES
  ]
  assert len(paths) > 300
  assert [flag for path in paths for flag in family_flags(path, names)] == []


def test_the_family_rule_catches_what_it_is_for(tmp_path):
  source = tmp_path / "norms.py"
  source.write_text(
    "def pick(config, d):\n"
    "  a = GemmaNorm if config.gemma else Norm\n"
    '  b = config.architecture == "mixtral"\n'
    '  c = arch in ("gemma2", "other")\n'
    "  e = TABLE[config.architecture]\n"
    "  f = {'Qwen3MoeForCausalLM': 1}\n"
    "  g = TABLE.get(config.architecture)\n"
    '  return ModelConfig(architecture="llama")  # constructing one is data, not a decision\n'
  )
  flags = family_flags(source, family_names())
  assert sorted(flag.rsplit(":", 1)[1] for flag in flags) == [
    "2 .gemma",
    "3 comparison",
    "4 comparison",
    "5 [architecture]",
    "6 table keyed by family",
    "7 .get(architecture)",
  ]
