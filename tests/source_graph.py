"""The source's import graph and the ast scans the architecture's rules (tests/architecture/) are
made of (nothing is imported: every module is read with `ast`)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxserve"
KERNELS = ROOT / "pallas_kernels"
JAX = ("jax", "jaxlib", "flax")


def parse(path: Path) -> ast.Module:
  """The file's syntax tree, parsed once per process and version of the file (the checks only
  read the trees; about 300 files are walked by each of a hundred tests)."""
  stat = path.stat()
  return _parse(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parse(path: Path, mtime_ns: int, size: int) -> ast.Module:
  return ast.parse(path.read_text(), str(path))


def module_name(path: Path, root: Path = ROOT) -> str:
  parts = list(path.relative_to(root).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(package: Path = PACKAGE) -> dict[str, Path]:
  return {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
  """Every module `name` imports (absolute names; `from a import b` names a.b when that is a
  module)."""
  is_package = path.name == "__init__.py"
  found = set()
  for node in ast.walk(parse(path)):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = name.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        target = ".".join(base + ([node.module] if node.module else []))
      else:
        target = node.module
      found.add(target)
      found.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known)
  return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
  modules = package_modules(package)
  if package == PACKAGE:
    modules.update(package_modules(KERNELS))
  known = set(modules)
  return {name: imports_of(name, path, known) for name, path in modules.items()}


def within(name: str, prefixes: tuple[str, ...]) -> bool:
  return any(name == p or name.startswith(p + ".") for p in prefixes)


def forbidden_edges(
  graph: dict[str, set[str]], sources: tuple[str, ...], targets: tuple[str, ...]
) -> list[tuple[str, str]]:
  return sorted(
    (m, t) for m, ts in graph.items() if within(m, sources) for t in ts if within(t, targets)
  )


def jax_reach(graph: dict[str, set[str]], start: str) -> list[list[str]]:
  """Import chains from `start` to jax/flax through jaxserve modules."""
  return reach(graph, start, JAX)


def reach(graph: dict[str, set[str]], start: str, targets: tuple[str, ...]) -> list[list[str]]:
  """Import chains from `start` to any of `targets` through jaxserve modules."""
  chains, seen, stack = [], {start}, [[start]]
  while stack:
    chain = stack.pop()
    for target in graph.get(chain[-1], ()):
      if within(target, targets):
        chains.append(chain + [target])
      elif target in graph and target not in seen:
        seen.add(target)
        stack.append(chain + [target])
  return chains


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (or a self-import)."""
  index, low, on_stack, stack, result, counter = {}, {}, set(), [], [], [0]

  def visit(v: str) -> None:
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in graph:
        continue
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1 or v in graph[v]:
        result.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return result


def package_of(module: str) -> str:
  """The node of `module` in the package graph: jaxserve.X for a subpackage X or a top-level
  module X of jaxserve, pallas_kernels for anything in it."""
  parts = module.split(".")
  return parts[0] if parts[0] != "jaxserve" else ".".join(parts[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  """The import graph between packages (package_of each module), without self-edges."""
  packages: dict[str, set[str]] = {package_of(m): set() for m in graph}
  for module, targets in graph.items():
    source = package_of(module)
    packages[source].update(
      package_of(t) for t in targets if t in graph and package_of(t) != source
    )
  return packages


BACKEND_LIKE = re.compile(r"backend|attention|attend", re.IGNORECASE)


def _is_backend_literal(node: ast.AST) -> bool:
  """A string (or a tuple of strings) naming an attention backend or kernel."""
  return any(
    isinstance(n, ast.Constant)
    and isinstance(n.value, str)
    and (n.value in ("reference", "xla") or n.value.startswith("pallas"))
    for n in ast.walk(node)
  )


def _is_name_of(node: ast.AST) -> bool:
  return isinstance(node, ast.Attribute) and node.attr == "name"


def _is_backend_name(node: ast.AST) -> bool:
  """`x.name` where x reads as an attention backend (backend.name, placement.attention.name)."""
  return _is_name_of(node) and BACKEND_LIKE.search(ast.unparse(node.value)) is not None


def backend_name_tests(tree: ast.AST) -> list[int]:
  """Lines that decide by an attention backend's display name: a comparison (==, !=, in, ...)
  with a backend's `.name`, or of any `.name` with a backend's name, and `.name.startswith(`
  / `.endswith(` on a backend's name or with a backend's name."""
  lines = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare):
      operands = [node.left, *node.comparators]
      if any(_is_backend_name(o) for o in operands) or (
        any(_is_name_of(o) for o in operands) and any(_is_backend_literal(o) for o in operands)
      ):
        lines.append(node.lineno)
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr in ("startswith", "endswith")
      and _is_name_of(node.func.value)
    ):
      if _is_backend_name(node.func.value) or any(_is_backend_literal(a) for a in node.args):
        lines.append(node.lineno)
  return lines


def definitions(name: str) -> list[str]:
  """Modules that define `name` (a def, class or assignment anywhere, methods included)."""
  return _definition_index(tuple(package_modules().items())).get(name, [])


@functools.cache
def _definition_index(modules: tuple[tuple[str, Path], ...]) -> dict[str, list[str]]:
  """Every name a module defines -> the modules defining it, in package_modules' order (one walk
  over the package for all the names asked about)."""
  index: dict[str, list[str]] = {}
  for module, path in modules:
    for node in ast.walk(parse(path)):
      names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else []
      targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AnnAssign)
        else []
      )
      names += [t.id for t in targets if isinstance(t, ast.Name)]
      for name in names:
        index.setdefault(name, []).append(module)
  return index


def reads_sampling_rows(tree: ast.AST) -> bool:
  """Whether a module handles sampling rows: it imports their schema, or reads a batch's
  `sampling.rows` or a request's `sampling_row_bytes`."""
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("sampling_row"):
      return True
    if isinstance(node, ast.Attribute) and (
      node.attr == "sampling_row_bytes"
      or (node.attr == "rows" and ast.unparse(node.value).endswith("sampling"))
    ):
      return True
  return False


def positional_row_reads(tree: ast.AST) -> list[str]:
  """Indexing by a literal number where a module could index a sampling row: a table subscript
  holding one (`table[:, 6]`), a subscript read by one of anything but an attribute
  (`row[6]`; `x.shape[0]` is fine), and a reshape to a literal width (`.reshape(n, 8)`)."""

  def is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int

  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Subscript):
      index = node.slice
      if (isinstance(index, ast.Tuple) and any(is_int(e) for e in index.elts)) or (
        is_int(index)
        and isinstance(node.ctx, ast.Load)
        and not isinstance(node.value, ast.Attribute)
      ):
        found.append(ast.unparse(node))
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr == "reshape"
      and any(is_int(a) and a.value > 1 for a in node.args)
    ):
      found.append(ast.unparse(node))
  return found
