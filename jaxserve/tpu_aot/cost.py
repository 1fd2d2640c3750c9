"""What XLA's cost model says one compiled program does per chip: its FLOPs and the HBM bytes it
reads and writes (`Compiled.cost_analysis()`, "flops" and "bytes accessed"; for an SPMD program,
one partition's).

Contract: XLA counts the operations it lowers itself. A Pallas (Mosaic) kernel is a custom call
without a cost estimate, which XLA counts as nothing: on TPU the ragged paged attention's reads
of the KV pages and its FLOPs are not in these figures (the bytes accessed of a forward do not
change with the pool's size), so the decode roofline (roofline.py) adds them from the shapes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProgramCost:
  flops: float
  bytes_accessed: float

  @classmethod
  def of(cls, analysis) -> ProgramCost:
    """From cost_analysis(): a dict (a list of one dict on older JAX releases)."""
    if isinstance(analysis, (list, tuple)):
      analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    return cls(float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0)))
