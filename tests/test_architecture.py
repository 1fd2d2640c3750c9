"""The architecture's rules, checked on the source with `ast` (nothing is imported, so this runs in
a fraction of a second and fails on the first edge that breaks a rule):

* the device side (device/, pallas_kernels/, attention/, models/, parallel/) imports nothing from
  the host side (engine/, core/, server/, structured/, tools/, bench/, llm.py, cli.py) nor from
  the composition root (assembly.py with pool_sizing.py, follower.py);
* what crosses the seam (messages/) imports no jax and nothing else of jaxserve;
* the host side (every module of engine/: scheduler (with its admission of waiting requests,
  decode bursts, prefix-cache page bookkeeping and step plan), page allocator, requests, batch
  builder, admission rules, the engine loop, which reaches the device side through the protocols of
  engine/device_port.py) imports no jax, directly or through any jaxserve module it imports;
* investigations/ (one-off device investigations, not installed) may import jaxserve, never the
  reverse: no jaxserve or pallas_kernels module imports it, and pip does not install it;
* server/ is HTTP only: it reaches neither jax nor the device side nor the composition root
  (the `serve` command hands the process to core/serve.py, the one edge not followed), starts
  no process (no multiprocessing, subprocess or os.fork), and core/ imports nothing of it;
* no import cycle among jaxserve modules, nor among packages (jaxserve.X, pallas_kernels);
* no decision by an attention backend's display name (callers read its capabilities);
* imports are explicit (no __import__);
* each policy has one definition (KVPages, the token-id and length admission rules, the n > 1
  expansion, the built-in model table, the sampling row's layout, the count of HTTP requests
  waiting to start);
* outside messages/, a sampling row is read by column name, never by position.

Imports are read everywhere in a module, function bodies included: a function-local import is
an edge like any other.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest
import tomllib

from tests.source_graph import (
  JAX,
  KERNELS,
  PACKAGE,
  ROOT,
  backend_name_tests,
  cycles,
  definitions,
  forbidden_edges,
  import_graph,
  jax_reach,
  package_graph,
  package_modules,
  positional_row_reads,
  reach,
  reads_sampling_rows,
  within,
)

TESTS = ROOT / "tests"

HOST = (
  "jaxserve.engine",
  "jaxserve.core",
  "jaxserve.server",
  "jaxserve.tools",
  "jaxserve.bench",
  "jaxserve.llm",
  "jaxserve.cli",
  "jaxserve.structured",
)
ROOTS = ("jaxserve.assembly", "jaxserve.pool_sizing", "jaxserve.follower")
DEVICE = (
  "jaxserve.device",
  "pallas_kernels",
  "jaxserve.attention",
  "jaxserve.models",
  "jaxserve.parallel",
  "jaxserve.quantization.quantize",  # the quantization package's scheme names are host data
  "jaxserve.quantization.matmul",
)
PURE_HOST = (
  "jaxserve.defaults",  # the device-aware defaults rule: a pure function of a description
  "jaxserve.config",  # the config tree: one module per section
  "jaxserve.config.engine",
  "jaxserve.config.cache",
  "jaxserve.config.scheduler",
  "jaxserve.config.distributed",
  "jaxserve.config_loader",  # the YAML / --set loader
  "jaxserve.device_description",
  "jaxserve.engine.scheduler",
  "jaxserve.engine.waiting_admission",
  "jaxserve.engine.mixed_steps",
  "jaxserve.engine.decode_burst",
  "jaxserve.engine.prefix_cache_pages",
  "jaxserve.engine.step_plan",
  "jaxserve.engine.page_allocator",
  "jaxserve.engine.kv_groups",
  "jaxserve.engine.request",
  "jaxserve.engine.batch_builder",
  "jaxserve.engine.admission",
  "jaxserve.engine.device_port",
  "jaxserve.engine.request_state",
  "jaxserve.engine.llm_engine",
  "jaxserve.engine.engine_core",
  "jaxserve.engine.step_results",
  "jaxserve.engine.step_timings",
  "jaxserve.engine.output_processor",
  "jaxserve.core.messages",
  "jaxserve.core.client",
  "jaxserve.core.streams",
  "jaxserve.core.info",
  "jaxserve.core.loop",
  "jaxserve.core.router",
  "jaxserve.core.restart_backoff",
  "jaxserve.core.api_processes",
  "jaxserve.core.dp_routing",
  "jaxserve.core.dp_client",
  "jaxserve.core.device_groups",
  "jaxserve.engine.engine_stats",
  "jaxserve.engine.core_io",
  "jaxserve.messages.scheduled_batch",
  "jaxserve.messages.step_output",
  "jaxserve.messages.buckets",
  "jaxserve.messages.program_readiness",
  "jaxserve.messages.sampling_row",
  "jaxserve.messages.kv_layout",
  "jaxserve.engine.constraints",
  "jaxserve.structured.matcher",
  "jaxserve.structured.grammar",
  "jaxserve.structured.tools",
  "jaxserve.quantization.scheme",
  "jaxserve.quantization.compressed_tensors",
  "jaxserve.quantization.capabilities",
)
INVESTIGATIONS = ("investigations",)
SERVER = ("jaxserve.server",)
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


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
  return import_graph()


def test_device_side_imports_nothing_from_the_host_side(graph):
  assert forbidden_edges(graph, DEVICE, HOST + ROOTS) == []


def test_the_seam_is_plain_data(graph):
  edges = forbidden_edges(graph, ("jaxserve.messages",), ("jaxserve",) + JAX)
  assert [(m, t) for m, t in edges if not within(t, ("jaxserve.messages",))] == []


@pytest.mark.parametrize("module", PURE_HOST)
def test_host_side_imports_no_jax(graph, module):
  assert module in graph
  assert jax_reach(graph, module) == []


def test_no_import_cycle(graph):
  assert cycles(graph) == []


def test_nothing_installed_imports_the_investigations(graph):
  assert (ROOT / "investigations" / "__init__.py").is_file()
  assert forbidden_edges(graph, ("jaxserve", "pallas_kernels"), INVESTIGATIONS) == []


def test_the_investigations_are_not_installed():
  find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
  include = find["find"]["include"]
  assert any(fnmatch.fnmatch("jaxserve.bench", pattern) for pattern in include)
  assert not any(
    fnmatch.fnmatch(name, pattern)
    for pattern in include
    for name in ("investigations", "investigations.bench_kernels")
  )


def test_no_package_cycle(graph):
  """No cycle among packages (jaxserve.X for each subpackage or top-level module X,
  pallas_kernels): the layering holds between packages, not only between modules (e.g. models
  below device, engine below core below server)."""
  packages = package_graph(graph)
  assert {
    "jaxserve.device",
    "jaxserve.models",
    "jaxserve.config",
    "jaxserve.config_loader",
    "pallas_kernels",
  } <= set(packages)
  assert cycles(packages) == []


# The packages from the lowest layer up (a top-level module counts as its own package). A package
# imports only from layers below its own: the walk of a request's prompt ids from the HTTP handler
# (server) through the core's client and loop (core) to the engine (engine), across the seam
# (messages) to the step programs (device), the model (models), the attention backend (attention)
# and the kernel (pallas_kernels) only goes down.
LAYERS: tuple[tuple[str, ...], ...] = (
  ("jaxserve.device_description", "jaxserve.config_require"),
  (
    "pallas_kernels",
    "jaxserve.messages",
    "jaxserve.outputs",
    "jaxserve.memory_stats",
    "jaxserve.gc_pauses",
    "jaxserve.log_setup",
    "jaxserve.optional_deps",
    "jaxserve.cli_help",
    "jaxserve.tokenizer",
    "jaxserve.quantization",
    "jaxserve.version",
  ),
  ("jaxserve.structured",),
  ("jaxserve.sampling_params",),
  ("jaxserve.server_config",),
  ("jaxserve.config",),
  ("jaxserve.config_loader",),
  ("jaxserve.engine_args", "jaxserve.attention", "jaxserve.engine", "jaxserve.defaults"),
  ("jaxserve.cli_args",),
  ("jaxserve.models",),
  ("jaxserve.device",),
  ("jaxserve.parallel", "jaxserve.platforms"),
  ("jaxserve.pool_sizing",),
  ("jaxserve.assembly",),
  ("jaxserve.follower",),
  ("jaxserve.core", "jaxserve.llm"),
  ("jaxserve.server", "jaxserve.tools"),
  ("jaxserve.tpu_aot",),
  ("jaxserve.bench",),
  ("jaxserve",),
  ("jaxserve.cli",),
)


def test_every_import_goes_down_the_layers(graph):
  layer = {package: i for i, packages in enumerate(LAYERS) for package in packages}
  packages = package_graph(graph)
  assert set(packages) == set(layer), "every package has a layer"
  upward = sorted(
    (a, b) for a, targets in packages.items() for b in targets if a != b and layer[b] >= layer[a]
  )
  assert upward == []


def test_no_decision_by_an_attention_backends_name():
  """Callers read a backend's capabilities (attention/capabilities.py), never its display name,
  which depends on the wrapping order."""
  found = [
    (str(path.relative_to(ROOT)), line)
    for root in (PACKAGE, KERNELS, TESTS)
    for path in sorted(root.rglob("*.py"))
    for line in backend_name_tests(ast.parse(path.read_text(), str(path)))
  ]
  assert found == []


@pytest.mark.parametrize(
  "name,where",
  [
    ("KVPages", ["jaxserve.attention.metadata"]),
    ("check_token_ids", ["jaxserve.engine.admission"]),
    ("check_length", ["jaxserve.engine.admission"]),
    ("expand_n", ["jaxserve.sampling_params"]),
    ("BUILTIN_MODELS", ["jaxserve.models.builtin"]),
    ("build_step_programs", ["jaxserve.device.step_programs"]),
    ("ModelRunner", ["jaxserve.device.model_runner"]),
    ("ScheduledBatch", ["jaxserve.messages.scheduled_batch"]),
    ("KVLayout", ["jaxserve.messages.kv_layout"]),
    ("kv_groups", ["jaxserve.models.kv_layout"]),
    ("StepOutput", ["jaxserve.messages.step_output"]),
    ("SamplingColumn", ["jaxserve.messages.sampling_row"]),
    ("SAMPLING_ROW_WIDTH", ["jaxserve.messages.sampling_row"]),
    ("GREEDY_ROW", ["jaxserve.messages.sampling_row"]),
    ("sampling_row", ["jaxserve.messages.sampling_row"]),
    ("QUANTIZATION_NAMES", ["jaxserve.quantization.scheme"]),
    ("much_busier", ["jaxserve.core.dp_routing"]),
    ("PrefixAffinityRouter", ["jaxserve.core.dp_routing"]),
    ("plan_device_groups", ["jaxserve.core.device_groups"]),
    ("check_quantization", ["jaxserve.quantization.scheme"]),
    ("resolve_quantization", ["jaxserve.quantization.compressed_tensors"]),
    ("is_quantized_kernel", ["jaxserve.models.quantized_dense"]),
    ("kernel_shape", ["jaxserve.models.quantized_dense"]),
    ("output_axis", ["jaxserve.models.quantized_dense"]),
  ],
)
def test_one_definition_per_policy(name, where):
  assert definitions(name) == where


def test_sampling_rows_are_read_by_column_name():
  """The row's layout is messages/sampling_row.py's alone: nobody else indexes a row by
  position or restates its width (the batch builder, the request and the step inputs handle
  rows)."""
  readers = {
    module: ast.parse(path.read_text())
    for module, path in package_modules().items()
    if not within(module, ("jaxserve.messages",))
  }
  readers = {m: tree for m, tree in readers.items() if reads_sampling_rows(tree)}
  assert {
    "jaxserve.engine.request",
    "jaxserve.engine.batch_builder",
    "jaxserve.device.step_inputs",
  } <= set(readers)
  assert {m: found for m, tree in readers.items() if (found := positional_row_reads(tree))} == {}


def test_every_engine_module_is_checked_for_jax(graph):
  assert {m for m in graph if within(m, ("jaxserve.engine",))} - {"jaxserve.engine"} <= set(
    PURE_HOST
  )


def test_one_seed_plus_k():
  """The n > 1 rule (child k samples with seed + k) is written once."""

  def adds_to_seed(node: ast.AST) -> bool:
    return (
      isinstance(node, ast.BinOp)
      and isinstance(node.op, ast.Add)
      and any(
        isinstance(side, ast.Attribute) and side.attr == "seed" for side in (node.left, node.right)
      )
    )

  found = [
    module
    for module, path in package_modules().items()
    for node in ast.walk(ast.parse(path.read_text()))
    if adds_to_seed(node)
  ]
  assert found == ["jaxserve.sampling_params"]


def test_imports_are_explicit():
  """No __import__ or importlib.import_module: a module that fails to import must fail loudly
  (the CLI once dropped a subcommand whose import failed) and every edge is in the graph."""
  dynamic = [
    module
    for module, path in package_modules().items()
    for node in ast.walk(ast.parse(path.read_text()))
    if isinstance(node, ast.Call)
    and (
      (isinstance(node.func, ast.Name) and node.func.id == "__import__")
      or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
    )
  ]
  assert dynamic == []


def test_the_tpu_build_reaches_the_engine_through_its_adapter_alone(graph):
  """jaxserve/tpu_aot: only step_programs.py imports the device side (models aside: named shapes
  and ModelConfig are data), the parallel layout, the engine or the composition root."""
  engine = tuple(p for p in DEVICE if p != "jaxserve.models") + ROOTS + ("jaxserve.engine",)
  edges = forbidden_edges(graph, ("jaxserve.tpu_aot",), engine)
  assert edges and {m for m, _ in edges} == {"jaxserve.tpu_aot.step_programs"}


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
  for node in ast.walk(ast.parse(path.read_text())):
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


def waiting_limit_checks(path: Path) -> int:
  """Comparisons of a count with a max_waiting limit (server.max_waiting_requests or the
  limit an add carries), not validations against a constant."""

  def is_limit(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.startswith("max_waiting")

  found = 0
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Compare):
      sides = [node.left, *node.comparators]
      if any(is_limit(side) for side in sides) and not any(
        isinstance(side, ast.Constant) for side in sides
      ):
        found += 1
  return found


def test_one_count_of_waiting_http_requests():
  """Admission (server.max_waiting_requests) has one owner: the engine core's loop, for every
  API server at once; nothing else counts waiting HTTP requests against the limit."""
  found = {m: n for m, p in package_modules().items() if (n := waiting_limit_checks(p))}
  assert found == {"jaxserve.core.loop": 1}
  assert definitions("WaitingRequests") == definitions("try_admit") == []


def test_no_subclass_of_the_runner():
  subclasses = [
    (module, node.name)
    for module, path in package_modules().items()
    for node in ast.walk(ast.parse(path.read_text()))
    if isinstance(node, ast.ClassDef)
    and any(isinstance(b, ast.Name) and b.id == "ModelRunner" for b in node.bases)
  ]
  assert subclasses == []


def test_the_rules_catch_what_they_are_for(tmp_path):
  """The checks above fail on a package that breaks them (so they cannot pass vacuously)."""
  package = tmp_path / "jaxserve"
  for sub in ("engine", "device"):
    (package / sub).mkdir(parents=True)
    (package / sub / "__init__.py").write_text("")
  (package / "__init__.py").write_text("")
  (package / "engine" / "request.py").write_text("from jaxserve.device import runner\n")
  (package / "device" / "runner.py").write_text(
    "import jax\nfrom jaxserve.engine.request import Request\n"
    "from investigations import profile_step\n"
  )
  graph = import_graph(package)
  assert forbidden_edges(graph, DEVICE, HOST) == [
    ("jaxserve.device.runner", "jaxserve.engine.request")
  ]
  assert forbidden_edges(graph, ("jaxserve",), INVESTIGATIONS) == [
    ("jaxserve.device.runner", "investigations")
  ]
  assert cycles(graph) == [["jaxserve.device.runner", "jaxserve.engine.request"]]
  assert jax_reach(graph, "jaxserve.engine.request") == [
    ["jaxserve.engine.request", "jaxserve.device.runner", "jax"]
  ]
  positional = ast.parse(
    "table = np.frombuffer(batch.sampling.rows).reshape(n, 8)\n"
    "floats[:, 1] = 1.0\ntop_k = table[:, 6]\nseed = row[7]\nsize = table.shape[0]\n"
  )
  assert reads_sampling_rows(positional)
  assert positional_row_reads(positional) == [
    "np.frombuffer(batch.sampling.rows).reshape(n, 8)",
    "floats[:, 1]",
    "table[:, 6]",
    "row[7]",
  ]
  assert cycles(package_graph(graph)) == [["jaxserve.device", "jaxserve.engine"]]
  names = ast.parse(
    "if backend.name == 'xla': pass\n"
    "if b.name.startswith('pallas_gpu'): pass\n"
    "if 'pallas_gpu' in placement.attention.name: pass\n"
    "x = self.backend.name.endswith(suffix)\n"
    "y = arg.name == 'model' or m.name.startswith(('xla_cuda',))\n"
    "z = backend.capabilities.kind is BackendKind.XLA\n"
  )
  assert backend_name_tests(names) == [1, 2, 3, 4]


# tests/<folder> mirrors a package: jaxserve/<folder>, or one of these (named for what they test).
TEST_FOLDERS_BEYOND_PACKAGES = {
  "pallas_kernels": "the top-level kernels package",
  "investigations": "the top-level investigations folder",
  "integration": "engines end to end, across packages",
  "cli": "the jaxserve command and its top-level modules (cli*.py, engine_args.py, platforms.py)",
}


def test_the_tests_mirror_the_packages():
  folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
  packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
  assert folders - packages - set(TEST_FOLDERS_BEYOND_PACKAGES) == set()
  assert set(TEST_FOLDERS_BEYOND_PACKAGES) <= folders
