"""Which step programs the device side has compiled: the buckets a step may be padded to now.

The device side (device/program_compiler.py) publishes a new ProgramReadiness each time a bucket's
programs are all compiled; the host (engine/engine_core.py) reads the latest one every step and pads
each batch to the smallest ready bucket that holds it (BucketSet.pick). Plain data, no jax: it
crosses a process boundary as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from .buckets import Bucket


@dataclass(frozen=True)
class ProgramReadiness:
  """steps: the buckets whose single-step programs (the forward, the sampler in every mode,
  prompt logprobs) are compiled; bursts: the buckets whose decode-burst programs are. None: any
  bucket (compiled, or compiled on first use)."""

  steps: frozenset[Bucket] | None = None
  bursts: frozenset[Bucket] | None = None
  num_compiled: int = 0  # step programs compiled so far
  num_total: int = 0  # step programs planned (0: not tracked, e.g. lazy compilation)
  finished_after_s: float | None = None  # warmup's start to the last program; None until then

  @property
  def complete(self) -> bool:
    return self.num_compiled >= self.num_total


ANY_BUCKET = ProgramReadiness()
