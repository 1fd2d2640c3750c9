"""The architecture's rules, checked on the source with `ast` (nothing is imported, so this runs in
a fraction of a second and fails on the first edge that breaks a rule):

* the device side (device/, pallas_kernels/, attention/, models/, parallel/) imports nothing from
  the host side (engine/, core/, server/, structured/, tools/, bench/, entrypoints/llm.py, cli/)
  nor from the composition root (composition/, entrypoints/follower.py);
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
* imports are explicit (no __import__);
* tests/<folder> mirrors a package;
* every import goes down the layers (LAYERS between packages; MODULE_LAYERS within config/ and
  composition/);
* the top level of jaxserve/ holds at most 6 modules (TOP_LEVEL names them, each with why);
* one subcommand dispatch: only config/subcommands.py calls argparse's add_subparsers (every
  command, at every level, is a record of a table);
* no configuration outside config/: no other module is named for it, reads YAML, defines a
  *Config / *Args / *Settings class or adds a `--set` override (NOT_CONFIGURATION: what only
  looks like configuration, each with why);
* no family flag outside the family modules (jaxserve/models/families/): nothing else reads a
  family attribute (`config.gemma`), compares or looks up a config's `architecture`, or compares
  with (or keys a table by) a family's name, model type or Hugging Face architecture name (the
  names are read from the families' `ModelFamily(...)` records); a family's specifics are its
  module's choices;
* one request record across the wire: engine/core_io.EngineCoreRequest is built in one place,
  engine/core_io.new_core_requests (where a prompt's ids become one checked tuple), and no module
  copies a record's prompt ids into a list (`list(x.prompt_token_ids)`; `tuple()` of the tuple
  is the tuple itself).

Each policy's one owner (one definition, rows read by column name, no decision by a backend's
name) is tests/test_one_owner.py's.

Imports are read everywhere in a module, function bodies included: a function-local import is
an edge like any other.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest
import tomllib

from tests.source_graph import (
  JAX,
  KERNELS,
  PACKAGE,
  ROOT,
  cycles,
  forbidden_edges,
  import_graph,
  jax_reach,
  package_graph,
  package_modules,
  parse,
  reach,
  within,
)

TESTS = ROOT / "tests"

HOST = (
  "jaxserve.engine",
  "jaxserve.core",
  "jaxserve.server",
  "jaxserve.tools",
  "jaxserve.bench",
  "jaxserve.entrypoints.llm",
  "jaxserve.cli",
  "jaxserve.structured",
)
ROOTS = ("jaxserve.composition", "jaxserve.entrypoints.follower")
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
  # the device-aware defaults rule: a pure function of a description
  "jaxserve.config.device_defaults",
  "jaxserve.config",  # the config tree: one module per section
  "jaxserve.config.engine",
  "jaxserve.config.cache",
  "jaxserve.config.scheduler",
  "jaxserve.config.distributed",
  "jaxserve.config.loader",  # the YAML / --set loader
  "jaxserve.config.require",
  "jaxserve.config.server",
  "jaxserve.config.engine_args",
  "jaxserve.config.cli_args",
  "jaxserve.config.cli_help",
  "jaxserve.config.inert_args",
  "jaxserve.config.human_ints",
  "jaxserve.config.vllm_flags",
  "jaxserve.config.serve_flags",
  "jaxserve.config.subcommands",
  "jaxserve.config.kernel_choices",
  "jaxserve.runtime.device_description",
  "jaxserve.engine.scheduler",
  "jaxserve.engine.waiting_admission",
  "jaxserve.engine.step_budget",
  "jaxserve.engine.decode_burst",
  "jaxserve.engine.prefix_cache_pages",
  "jaxserve.engine.step_plan",
  "jaxserve.engine.page_allocator",
  "jaxserve.engine.kv_groups",
  "jaxserve.engine.request",
  "jaxserve.engine.request_queue",
  "jaxserve.engine.batch_builder",
  "jaxserve.engine.admission",
  "jaxserve.engine.device_port",
  "jaxserve.engine.request_state",
  "jaxserve.engine.llm_engine",
  "jaxserve.engine.engine_core",
  "jaxserve.engine.sleep_mode",
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
    "jaxserve.composition",
    "pallas_kernels",
  } <= set(packages)
  assert cycles(packages) == []


# The packages from the lowest layer up (a top-level module counts as its own package). A package
# imports only from layers below its own: the walk of a request's prompt ids from the HTTP handler
# (server) through the core's client and loop (core) to the engine (engine), across the seam
# (messages) to the step programs (device), the model (models), the attention backend (attention)
# and the kernel (pallas_kernels) only goes down.
LAYERS: tuple[tuple[str, ...], ...] = (
  ("jaxserve.runtime",),
  (
    "pallas_kernels",
    "jaxserve.messages",
    "jaxserve.tokenizer",
    "jaxserve.reasoning",
    "jaxserve.quantization",
    "jaxserve.version",
  ),
  ("jaxserve.structured",),
  ("jaxserve.api",),
  ("jaxserve.config",),
  ("jaxserve.attention", "jaxserve.engine"),
  ("jaxserve.models",),
  ("jaxserve.device",),
  ("jaxserve.parallel",),
  ("jaxserve.composition",),
  ("jaxserve.entrypoints",),
  ("jaxserve.core",),
  ("jaxserve.server", "jaxserve.tools"),
  ("jaxserve.tpu_aot",),
  ("jaxserve.bench",),
  ("jaxserve",),
  ("jaxserve.cli",),
)

# Within a package, its modules' layers, from the lowest up (a package's __init__ counts as a
# module): the configuration's checks and leaf tables, the server section, the other sections,
# the tree (config/__init__.py), the YAML / --set loader, the flags and the device-aware defaults
# over it, the parser that adds the flags; the KV pool's sizing below the engine's assembly.
MODULE_LAYERS: dict[str, tuple[tuple[str, ...], ...]] = {
  "jaxserve.config": (
    (
      "jaxserve.config.require",
      "jaxserve.config.subcommands",
      "jaxserve.config.cli_help",
      "jaxserve.config.human_ints",
      "jaxserve.config.inert_args",
      "jaxserve.config.generation_config",
      "jaxserve.config.kernel_choices",
    ),
    ("jaxserve.config.server",),
    (
      "jaxserve.config.cache",
      "jaxserve.config.distributed",
      "jaxserve.config.scheduler",
      "jaxserve.config.vllm_flags",
      "jaxserve.config.serve_flags",
    ),
    ("jaxserve.config.engine",),
    ("jaxserve.config",),
    ("jaxserve.config.loader",),
    ("jaxserve.config.engine_args", "jaxserve.config.device_defaults"),
    ("jaxserve.config.cli_args",),
    ("jaxserve.config.serve_flags",),
  ),
  "jaxserve.composition": (
    ("jaxserve.composition",),
    ("jaxserve.composition.pool_sizing",),
    ("jaxserve.composition.assembly",),
  ),
}


def test_every_import_goes_down_the_layers(graph):
  layer = {package: i for i, packages in enumerate(LAYERS) for package in packages}
  packages = package_graph(graph)
  assert set(packages) == set(layer), "every package has a layer"
  upward = sorted(
    (a, b) for a, targets in packages.items() for b in targets if a != b and layer[b] >= layer[a]
  )
  assert upward == []


@pytest.mark.parametrize("package", sorted(MODULE_LAYERS))
def test_every_import_within_a_package_goes_down_its_layers(graph, package):
  layer = {module: i for i, modules in enumerate(MODULE_LAYERS[package]) for module in modules}
  assert {m for m in graph if within(m, (package,))} == set(layer), "every module has a layer"
  upward = sorted(
    (a, b) for a in layer for b in graph[a] if b in layer and a != b and layer[b] >= layer[a]
  )
  assert upward == []


def test_every_engine_module_is_checked_for_jax(graph):
  assert {m for m in graph if within(m, ("jaxserve.engine",))} - {"jaxserve.engine"} <= set(
    PURE_HOST
  )


def test_imports_are_explicit():
  """No __import__ or importlib.import_module: a module that fails to import must fail loudly
  (the CLI once dropped a subcommand whose import failed) and every edge is in the graph."""
  dynamic = [
    module
    for module, path in package_modules().items()
    for node in ast.walk(parse(path))
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
  assert cycles(package_graph(graph)) == [["jaxserve.device", "jaxserve.engine"]]


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


# tests/<folder> mirrors a package: jaxserve/<folder>, or one of these (named for what they test).
TEST_FOLDERS_BEYOND_PACKAGES = {
  "pallas_kernels": "the top-level kernels package",
  "investigations": "the top-level investigations folder",
  "integration": "engines end to end, across packages",
  "architecture": "the architecture's rules, checked on the source",
}


def test_the_tests_mirror_the_packages():
  folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
  packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
  assert folders - packages - set(TEST_FOLDERS_BEYOND_PACKAGES) == set()
  assert set(TEST_FOLDERS_BEYOND_PACKAGES) <= folders


# The top level of jaxserve/ keeps what no package owns; everything else is in a named package.
TOP_LEVEL = {
  "__init__": "the package's face: LLM, SamplingParams, __version__",
  "version": "jaxserve's version (GET /version, the wheel's)",
}
MAX_TOP_LEVEL = 6


def test_the_top_level_holds_at_most_six_modules():
  assert len(TOP_LEVEL) <= MAX_TOP_LEVEL
  assert {path.stem for path in PACKAGE.glob("*.py")} == set(TOP_LEVEL)


CONFIG = PACKAGE / "config"
CONFIG_WORD = re.compile(r"config|args|flags|defaults|settings")
CONFIG_CLASS = re.compile(r"(Config|Args|Settings)$")
# What outside config/ looks like configuration but is not jaxserve's own settings, and why.
NOT_CONFIGURATION = {
  "models/model_config.py": "the checkpoint's config.json, as the model families read it",
  "models/model_config.py class ModelConfig": "the checkpoint's config.json, read",
  "models/hf_config.py": "reads a checkpoint's config.json into a ModelConfig",
  "models/hf_config_json.py": "writes a ModelConfig back as a checkpoint's config.json",
  "models/moe_config.py": "a checkpoint's experts, from its config.json",
  "tokenizer/configured.py": "loads the tokenizer the config's tokenizer keys name",
  "bench/flags.py": "a benchmark run's own flags (the engine's: config/cli_args.py)",
  "bench/soak_flags.py": "the soak benchmark's own flags",
  "bench/serve_client.py class ServeBenchConfig": "a serving benchmark run's parameters",
  "core/info.py class ApiProcessArgs": "what the engine core hands an API process (IPC)",
}


def configuration_in(path: Path, package: Path = PACKAGE) -> list[str]:
  """What module `path` holds of configuration: a name that says so (config, args, flags,
  defaults, settings), YAML (the config file's format), a class named *Config, *Args or
  *Settings, a `--set` override added to a parsed command line (`args.overrides.append(...)`)."""
  where = path.relative_to(package).as_posix()
  found = [where] if CONFIG_WORD.search(path.stem) else []
  for node in ast.walk(parse(path)):
    if (isinstance(node, ast.Import) and any(within(a.name, ("yaml",)) for a in node.names)) or (
      isinstance(node, ast.ImportFrom) and within(node.module or "", ("yaml",))
    ):
      found.append(f"{where} imports yaml")
    elif isinstance(node, ast.ClassDef) and CONFIG_CLASS.search(node.name):
      found.append(f"{where} class {node.name}")
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr in ("append", "extend")
      and isinstance(node.func.value, ast.Attribute)
      and node.func.value.attr == "overrides"
    ):
      found.append(f"{where}:{node.lineno} .overrides.{node.func.attr}(...)")
  return found


def configuration_outside_config(package: Path = PACKAGE) -> set[str]:
  config = package / "config"
  return {
    found
    for path in sorted(package.rglob("*.py"))
    if config not in path.parents
    for found in configuration_in(path, package)
  }


def test_no_configuration_outside_config():
  """config/ owns every setting: its tree, the YAML / --set loader, the flags and their help,
  the engine arguments, the device-aware defaults. Nothing else is named for configuration,
  reads YAML, defines a *Config / *Args / *Settings class or adds a `--set` override, but
  what NOT_CONFIGURATION lists (each with why; none stale)."""
  found = configuration_outside_config()
  assert sorted(found - set(NOT_CONFIGURATION)) == []
  assert set(NOT_CONFIGURATION) <= found


def test_the_configuration_rule_catches_what_it_is_for(tmp_path):
  package = tmp_path / "jaxserve"
  (package / "config").mkdir(parents=True)
  (package / "server").mkdir()
  (package / "config" / "loader.py").write_text("import yaml\nclass EngineConfig: ...\n")
  (package / "server" / "server_flags.py").write_text("")
  (package / "server" / "cli.py").write_text(
    "from yaml import safe_load\n"
    "class ServeArgs: ...\n"
    "def serve(args):\n"
    "  args.overrides.append('server.port=1')\n"
    "  overrides = []\n"
    "  overrides.append('not a parsed command line')\n"
  )
  assert sorted(configuration_outside_config(package)) == [
    "server/cli.py class ServeArgs",
    "server/cli.py imports yaml",
    "server/cli.py:4 .overrides.append(...)",
    "server/server_flags.py",
  ]


SUBCOMMANDS = CONFIG / "subcommands.py"


def subparser_calls(package: Path = PACKAGE) -> list[str]:
  """Where a module of `package` calls argparse's add_subparsers."""
  return [
    f"{path.relative_to(package).as_posix()}:{node.lineno}"
    for path in sorted(package.rglob("*.py"))
    for node in ast.walk(parse(path))
    if isinstance(node, ast.Call)
    and isinstance(node.func, ast.Attribute)
    and node.func.attr == "add_subparsers"
  ]


def test_one_subcommand_dispatch():
  """The commands are tables of config/subcommands.Subcommand records (cli/__init__.py's
  COMMANDS, bench/cli.py's under `bench`); add_subcommands is the one dispatch that builds them."""
  (call,) = subparser_calls()
  assert call.startswith(SUBCOMMANDS.relative_to(PACKAGE).as_posix() + ":")
