"""Every import goes down the layers: between packages (LAYERS, a top-level module counting as
its own package) and, within config/ and composition/, between their modules (MODULE_LAYERS); no
import cycle among jaxserve modules, nor among packages (jaxserve.X, pallas_kernels).
docs/ARCHITECTURE.md's package layout states the same layers (tests/test_docs.py)."""

from __future__ import annotations

import pytest

from tests.source_graph import cycles, package_graph, within

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


def test_no_import_cycle(graph):
  assert cycles(graph) == []


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
