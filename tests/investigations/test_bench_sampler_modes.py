"""investigations/bench_sampler_modes.py times every sampler mode on inputs the sampler takes."""

from __future__ import annotations

from investigations.bench_sampler_modes import time_modes
from jaxserve.device.sampler import SamplerMode


def test_every_mode_is_timed():
  results = time_modes(rows=2, vocab=64, history=4, reps=1)
  assert len(results) == len(SamplerMode.all())
  assert all(r["ms"] > 0 for r in results)
