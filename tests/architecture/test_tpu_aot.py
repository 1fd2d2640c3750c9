"""jaxserve/tpu_aot (`jaxserve compile-tpu`) reaches the device side and the engine through its
adapter alone, tpu_aot/step_programs.py."""

from __future__ import annotations

from tests.architecture.scopes import DEVICE, ROOTS
from tests.source_graph import forbidden_edges


def test_the_tpu_build_reaches_the_engine_through_its_adapter_alone(graph):
  """jaxserve/tpu_aot: only step_programs.py imports the device side (models aside: named shapes
  and ModelConfig are data), the parallel layout, the engine or the composition root."""
  engine = tuple(p for p in DEVICE if p != "jaxserve.models") + ROOTS + ("jaxserve.engine",)
  edges = forbidden_edges(graph, ("jaxserve.tpu_aot",), engine)
  assert edges and {m for m, _ in edges} == {"jaxserve.tpu_aot.step_programs"}
