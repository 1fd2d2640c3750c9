"""The parts of the tree several architecture rules name, as module-name prefixes of the import
graph (tests/source_graph.py): the host side, the composition root, the device side, the HTTP
server, the investigations."""

from __future__ import annotations

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
SERVER = ("jaxserve.server",)
INVESTIGATIONS = ("investigations",)
