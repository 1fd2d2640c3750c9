"""Median wall time of a jitted call, to completion (dispatch and sync included): the one timing
loop of the benchmarks (profile_step, kernel_timing's unrolled programs, bench/batch_invariance's
component checks)."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import jax


def median_seconds(fn: Callable, *args, reps: int = 5) -> float:
  """Median seconds of fn(*args) over `reps` calls after one warm call, each to completion."""
  jax.block_until_ready(fn(*args))
  samples = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    samples.append(time.perf_counter() - start)
  return statistics.median(samples)


def median_ms(fn: Callable, *args, reps: int = 5) -> float:
  """median_seconds in milliseconds, rounded to microseconds (for tables)."""
  return round(1e3 * median_seconds(fn, *args, reps=reps), 3)
