"""server/ is HTTP only: it reaches neither jax nor the device side nor the composition root
through anything it imports (the `serve` command hands the process to core/serve.py, the one edge
not followed), starts no process (no multiprocessing, subprocess or os.fork), and core/ imports
nothing of it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.architecture.scopes import DEVICE, ROOTS, SERVER
from tests.source_graph import JAX, PACKAGE, forbidden_edges, package_modules, parse, reach, within

SERVE_HANDOFF = ("jaxserve.server.cli", "jaxserve.core.serve")  # `jaxserve serve` -> core/
PROCESS_MODULES = ("multiprocessing", "subprocess")
PROCESS_CALLS = (
  "fork",
  "forkpty",
  "posix_spawn",
  "posix_spawnp",
  "spawnv",
  "spawnl",
  "system",
  "popen",
  "execv",
  "execvp",
  "Process",
  "Popen",
)


def test_server_reaches_neither_jax_nor_the_device_side(graph):
  """Through every jaxserve module it imports, function bodies included; the `serve` command's
  hand-off to core/serve.py (which builds the engine or starts the processes) is not followed."""
  source, handoff = SERVE_HANDOFF
  assert handoff in graph[source]
  served = {m: ts - {handoff} if m == source else ts for m, ts in graph.items()}
  servers = [m for m in graph if within(m, SERVER)]
  assert len(servers) > 10
  assert {m: reach(served, m, JAX + DEVICE + ROOTS) for m in servers} == {m: [] for m in servers}
  assert forbidden_edges(graph, SERVER, JAX + DEVICE + ROOTS) == []


def test_core_imports_nothing_of_the_server(graph):
  assert forbidden_edges(graph, ("jaxserve.core",), SERVER) == []


def process_starts(path: Path) -> list[str]:
  """What in a module could start a process: an import of multiprocessing or subprocess (or
  of a name from them), or a call like os.fork(), Process(...), Popen(...)."""
  found = []
  for node in ast.walk(parse(path)):
    if isinstance(node, ast.Import):
      found += [a.name for a in node.names if within(a.name, PROCESS_MODULES)]
    elif (
      isinstance(node, ast.ImportFrom)
      and node.module
      and (
        within(node.module, PROCESS_MODULES)
        or any(a.name in ("ProcessPoolExecutor",) + PROCESS_CALLS for a in node.names)
      )
    ):
      found.append(node.module)
    elif isinstance(node, ast.Call):
      func = node.func
      name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
      if name in PROCESS_CALLS:
        found.append(f"{name}()")
  return found


def test_server_starts_no_process():
  modules = {m: p for m, p in package_modules().items() if within(m, SERVER)}
  assert {m: process_starts(p) for m, p in modules.items()} == {m: [] for m in modules}
  assert process_starts(PACKAGE / "core" / "api_processes.py")  # the check sees one
