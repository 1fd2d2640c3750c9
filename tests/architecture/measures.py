"""The tree in numbers: what issue 57 counted by reading the tree, counted by a program, for
this tree or any other (a `git archive` of an older commit):

    python -m tests.architecture.measures                  # this tree
    python -m tests.architecture.measures --root /tmp/old  # another one

Each count is over the source's syntax trees (`ast`; nothing is imported, comments and
docstrings are not code) or the docs' text, as its function's docstring says:

* walk_files: the source files the numbered walk of docs/ARCHITECTURE.md ("One request, from
  HTTP to the kernel and back") names in its steps 1 to 9, from the handler to the kernel;
* request_records: the classes that hold a request's prompt ids (a `prompt_token_ids` field;
  not the results, *Output);
* prompt_copies: the list / tuple copies of a whole prompt's ids, prompt_checks: the range
  checks of a prompt's ids, both in the files of walk steps 1 to 4 and 13 (the record's way
  from the handler into the core, and the output side);
* restated_arguments: LLMEngine's constructor's parameters that EngineCore's takes too;
* package_graph, floors: the packages (jaxserve.X for a subpackage or top-level module X,
  pallas_kernels) and the longest import chain among them;
* top_level_modules: the modules at jaxserve/'s top level;
* configuration_places: config/ and every top-level package or module outside it that holds
  configuration (test_configuration.configuration_in, less its look-alikes);
* subcommand_dispatches: the calls of argparse's add_subparsers;
* family_files: the source files whose code names a model family (an identifier or a string
  that is not a docstring);
* performance_lines, performance_headings, doc_result_files: docs/PERFORMANCE.md's lines and
  headings, and the files under docs/ that are not Markdown.

tests/architecture/test_measures.py checks that docs/ARCHITECTURE.md's "The tree in numbers"
states this tree's numbers and that they stay within their ceilings. It lives beside the rules
rather than in investigations/ because it counts with their scans (the import graph of
tests/source_graph.py, the configuration scan of test_configuration.py), and investigations/
imports nothing of tests/.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from tests import source_graph
from tests.architecture.test_configuration import NOT_CONFIGURATION, configuration_outside_config
from tests.architecture.walk import Tree, walk_files
from tests.source_graph import ROOT, imports_of, package_modules, parse

RECORD_PATH = (1, 2, 3, 4, 13)  # the record's way into the core, and the output side
FAMILIES = {"gemma": r"gemma", "qwen3_moe": r"qwen3_?moe", "mixtral": r"mixtral"}
PROMPT_IDS = ("prompt_token_ids", "prompt_ids", "prompt_tokens")
CHECK = "check_token_ids"  # its first parameter is a prompt's ids


# -- the request's records ------------------------------------------------------------------------
def _fields(cls: ast.ClassDef) -> set[str]:
  return {
    node.target.id
    for node in cls.body
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
  }


def request_records(tree: Tree) -> list[str]:
  """The classes of jaxserve/ with a `prompt_token_ids` field, the results (*Output, *Result)
  aside."""
  return sorted(
    f"{tree.relative(path)} {node.name}"
    for path in sorted(tree.package.rglob("*.py"))
    for node in ast.walk(parse(path))
    if isinstance(node, ast.ClassDef)
    and "prompt_token_ids" in _fields(node)
    and not node.name.endswith(("Output", "Result"))
  )


def _last_name(node: ast.AST) -> str | None:
  return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)


def _copies(node: ast.AST, names: tuple[str, ...]) -> list[int]:
  """Lines of `list(x)` / `tuple(x)` under `node`, x a name or attribute in `names` (a slice of
  x is not the whole of it); inside check_token_ids, its first parameter is a prompt's ids."""
  lines = []
  for child in ast.iter_child_nodes(node):
    inner = names
    if isinstance(child, ast.FunctionDef) and child.name == CHECK:
      inner = names + (child.args.args[0].arg,)
    if (
      isinstance(child, ast.Call)
      and _last_name(child.func) in ("list", "tuple")
      and len(child.args) == 1
      and _last_name(child.args[0]) in names
    ):
      lines.append(child.lineno)
    lines += _copies(child, inner)
  return lines


def prompt_copies(tree: Tree) -> list[str]:
  """The copies of a whole prompt's ids (`list(x)` / `tuple(x)`, x named prompt_token_ids,
  prompt_ids or prompt_tokens, or check_token_ids' own argument) in the files of the record's
  path."""
  return [
    f"{name}:{line}"
    for name in walk_files(tree, RECORD_PATH)
    for line in sorted(_copies(parse(tree.root / name), PROMPT_IDS))
  ]


def prompt_checks(tree: Tree) -> list[str]:
  """Calls of check_token_ids on a prompt (its argument named for one) in the files of the
  record's path."""
  found = []
  for name in walk_files(tree, RECORD_PATH):
    for node in ast.walk(parse(tree.root / name)):
      if (
        isinstance(node, ast.Call)
        and _last_name(node.func) == CHECK
        and "prompt" in (_last_name(node.args[0]) or "")
      ):
        found.append(f"{name}:{node.lineno}")
  return found


def _init_parameters(tree: Tree, module: str, cls: str) -> set[str]:
  for node in ast.walk(parse(tree.package / module)):
    if isinstance(node, ast.ClassDef) and node.name == cls:
      for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
          arguments = item.args.posonlyargs + item.args.args + item.args.kwonlyargs
          return {a.arg for a in arguments} - {"self"}
  return set()


def restated_arguments(tree: Tree) -> list[str]:
  """The parameters of LLMEngine's constructor that EngineCore's constructor also takes (what
  LLMEngine restates instead of taking the core)."""
  engine = _init_parameters(tree, "engine/llm_engine.py", "LLMEngine")
  core = _init_parameters(tree, "engine/engine_core.py", "EngineCore")
  return sorted(engine & core)


# -- the package ----------------------------------------------------------------------------------
def package_graph(tree: Tree) -> dict[str, set[str]]:
  """The import graph between packages (jaxserve.X, pallas_kernels), as tests/source_graph.py
  builds it for this tree."""
  modules = package_modules(tree.package) | package_modules(tree.root / "pallas_kernels")
  graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}
  return source_graph.package_graph(graph)


def floors(tree: Tree) -> int:
  """The packages of the longest import chain among them (the layers a tree needs at least)."""
  graph = package_graph(tree)
  depth: dict[str, int] = {}

  def height(package: str) -> int:
    if package not in depth:
      depth[package] = 0  # a cycle (none here: tests/architecture/test_layers.py) ends a chain
      depth[package] = 1 + max((height(t) for t in graph[package]), default=0)
    return depth[package]

  return max(height(p) for p in graph)


def top_level_modules(tree: Tree) -> list[str]:
  return sorted(p.name for p in tree.package.glob("*.py"))


def configuration_places(tree: Tree) -> list[str]:
  """config/, and each package or top-level module outside it that holds configuration."""
  found = configuration_outside_config(tree.package) - set(NOT_CONFIGURATION)
  places = {f.split()[0].split(":")[0].split("/")[0] for f in found}
  return sorted({"config/"} | {p if p.endswith(".py") else p + "/" for p in places})


def subcommand_dispatches(tree: Tree) -> list[str]:
  return [
    f"{tree.relative(path)}:{node.lineno}"
    for path in sorted(tree.package.rglob("*.py"))
    for node in ast.walk(parse(path))
    if isinstance(node, ast.Call) and _last_name(node.func) == "add_subparsers"
  ]


def _code_words(module: ast.Module) -> set[str]:
  """The identifiers and the strings of a module's code (docstrings are not code)."""
  docstrings = {
    id(node.body[0].value)
    for node in ast.walk(module)
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    and node.body
    and isinstance(node.body[0], ast.Expr)
    and isinstance(node.body[0].value, ast.Constant)
  }
  words = set()
  for node in ast.walk(module):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      if id(node) not in docstrings:
        words.add(node.value)
    elif isinstance(node, ast.Name):
      words.add(node.id)
    elif isinstance(node, ast.Attribute):
      words.add(node.attr)
    elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
      words.add(node.name)
    elif isinstance(node, ast.alias):
      words.update((node.name, node.asname or ""))
    elif isinstance(node, ast.ImportFrom):
      words.add(node.module or "")
    elif isinstance(node, ast.arg):
      words.add(node.arg)
  return words


def family_files(tree: Tree, family: str) -> list[str]:
  """The source files whose code names `family` (FAMILIES' pattern, any case)."""
  pattern = re.compile(FAMILIES[family], re.IGNORECASE)
  return [
    tree.relative(path)
    for path in tree.sources()
    if any(pattern.search(word) for word in _code_words(parse(path)))
  ]


# -- the docs -------------------------------------------------------------------------------------
def performance_lines(tree: Tree) -> int:
  return len((tree.root / "docs" / "PERFORMANCE.md").read_text().splitlines())


def performance_headings(tree: Tree) -> int:
  text = (tree.root / "docs" / "PERFORMANCE.md").read_text()
  return len(re.findall(r"^#+ ", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M))


def doc_result_files(tree: Tree) -> int:
  return sum(1 for p in (tree.root / "docs").rglob("*") if p.is_file() and p.suffix != ".md")


def measures(tree: Tree) -> dict[str, int]:
  """Every count, by the name docs/ARCHITECTURE.md's table gives it."""
  return {
    "files from server/app.py to the kernel": len(walk_files(tree)),
    "request records": len(request_records(tree)),
    "copies of a prompt's ids": len(prompt_copies(tree)),
    "checks of a prompt's ids": len(prompt_checks(tree)),
    "LLMEngine arguments restating EngineCore's": len(restated_arguments(tree)),
    "packages and top-level modules": len(package_graph(tree)),
    "floors (the longest import chain)": floors(tree),
    "modules at jaxserve/'s top level": len(top_level_modules(tree)),
    "configuration places": len(configuration_places(tree)),
    "subcommand dispatches": len(subcommand_dispatches(tree)),
    **{f"files naming {f}": len(family_files(tree, f)) for f in FAMILIES},
    "docs/PERFORMANCE.md lines": performance_lines(tree),
    "docs/PERFORMANCE.md headings": performance_headings(tree),
    "result files under docs/": doc_result_files(tree),
  }


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--root", type=Path, default=ROOT, help="a checkout (default: this one)")
  parser.add_argument("--list", action="store_true", help="what each count counted")
  args = parser.parse_args(argv)
  tree = Tree(args.root.resolve())
  for name, value in measures(tree).items():
    print(f"{value:>6}  {name}")
  if args.list:
    lists = {
      "walk (steps 1-9)": walk_files(tree),
      "records": request_records(tree),
      "copies": prompt_copies(tree),
      "checks": prompt_checks(tree),
      "restated": restated_arguments(tree),
      "packages": sorted(package_graph(tree)),
      "top level": top_level_modules(tree),
      "configuration": configuration_places(tree),
      "dispatches": subcommand_dispatches(tree),
      **{f"family {f}": family_files(tree, f) for f in FAMILIES},
    }
    for name, items in lists.items():
      print(f"\n{name}:", *items, sep="\n  ")


if __name__ == "__main__":
  main()
