"""Median wall time of a jitted call, for the component checks of bench/batch_invariance.py."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import jax


def median_ms(fn: Callable, *args, reps: int = 5) -> float:
  """Median milliseconds of fn(*args) over `reps` calls after one warm call, to completion."""
  jax.block_until_ready(fn(*args))
  samples = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    samples.append(time.perf_counter() - start)
  return round(1e3 * statistics.median(samples), 3)
