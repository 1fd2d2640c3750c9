"""The host and the device are separate worlds: the device side (device/, pallas_kernels/,
attention/, models/, parallel/) imports nothing from the host side (engine/, core/, server/,
structured/, tools/, bench/, entrypoints/llm.py, cli/) nor from the composition root
(composition/, entrypoints/follower.py); what crosses the seam (messages/) imports no jax and
nothing else of jaxserve; the host side (every module of engine/: scheduler (with its admission
of waiting requests, decode bursts, prefix-cache page bookkeeping and step plan), page allocator,
requests, batch builder, admission rules, the engine loop, which reaches the device side through
the protocols of engine/device_port.py) imports no jax, directly or through any jaxserve module
it imports."""

from __future__ import annotations

import pytest

from tests.architecture.scopes import DEVICE, HOST, INVESTIGATIONS, ROOTS
from tests.source_graph import (
  JAX,
  cycles,
  forbidden_edges,
  import_graph,
  jax_reach,
  package_graph,
  within,
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
  "jaxserve.config.kernel_choices",
  "jaxserve.config.human_ints",
  "jaxserve.config.vllm_flags",
  "jaxserve.config.serve_flags",
  "jaxserve.config.subcommands",
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


def test_device_side_imports_nothing_from_the_host_side(graph):
  assert forbidden_edges(graph, DEVICE, HOST + ROOTS) == []


def test_the_seam_is_plain_data(graph):
  edges = forbidden_edges(graph, ("jaxserve.messages",), ("jaxserve",) + JAX)
  assert [(m, t) for m, t in edges if not within(t, ("jaxserve.messages",))] == []


@pytest.mark.parametrize("module", PURE_HOST)
def test_host_side_imports_no_jax(graph, module):
  assert module in graph
  assert jax_reach(graph, module) == []


def test_every_engine_module_is_checked_for_jax(graph):
  assert {m for m in graph if within(m, ("jaxserve.engine",))} - {"jaxserve.engine"} <= set(
    PURE_HOST
  )


def test_the_rules_catch_what_they_are_for(tmp_path):
  """The graph's checks (this module's, and the investigations', cycles' and jax reach's of
  test_investigations.py and test_layers.py) fail on a package that breaks them (so they cannot
  pass vacuously)."""
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
