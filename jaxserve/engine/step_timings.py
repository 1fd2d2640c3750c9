"""StepTimings: where the engine loop's wall time goes. Pure Python, no jax.

EngineCore.step adds to it: host work by phase (schedule / prepare / dispatch / bitmask /
process / outputs), time blocked waiting for a step's results, and each step's device time per
bucket. Benchmarks (bench offline, profile_step) read it through LLMEngine.timings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class StepTimings:
  """Cumulative wall time of the engine loop: host work, time blocked on the device, and each
  step's device time. A step's device time is measured from its dispatch, or from the end of
  the step before it when that was later, to the moment its results were on the host; with
  async scheduling that is exact while the device is the bottleneck and an upper bound when
  the host is."""

  num_steps: int = 0
  host_seconds: float = 0.0  # scheduling, building step inputs, processing outputs
  wait_seconds: float = 0.0  # blocked waiting for a step's results
  device_seconds: float = 0.0  # sum of the steps' device times
  per_bucket: dict = field(default_factory=dict)  # (num_seqs, num_tokens) -> [steps, seconds]
  host_phases: dict = field(default_factory=dict)  # schedule / prepare / dispatch / process -> s
  host_per_bucket: dict = field(default_factory=dict)  # bucket -> [steps, host s of the step()
  # calls that dispatched that bucket]

  def add_phase(self, name: str, since: float) -> float:
    """Adds the time since `since` to host phase `name`; returns now."""
    now = time.perf_counter()
    self.host_phases[name] = self.host_phases.get(name, 0.0) + now - since
    return now

  def record(self, bucket: tuple[int, int], device_seconds: float) -> None:
    self.num_steps += 1
    self.device_seconds += device_seconds
    entry = self.per_bucket.setdefault(bucket, [0, 0.0])
    entry[0] += 1
    entry[1] += device_seconds
