"""Median wall time of a jitted call, to completion (dispatch and sync included): the timing loops
of the benchmarks (batch_invariance's component checks, bench_structured's mask select) and of
the investigations built on them (investigations/: profile_step, kernel_timing, the sampler
benchmarks). `median_seconds` times one call at a time; `seconds_per_call` times `inner` calls
back to back and divides."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

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


def seconds_per_call(fn, *args, inner: int, reps: int) -> float:
  """Median over `reps` of the wall seconds per call of `inner` back-to-back calls fn(*args)
  (one compile-and-run first)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    for _ in range(inner):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / inner)
  return statistics.median(times)
