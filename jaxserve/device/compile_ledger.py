"""Counts XLA compilations through jax.monitoring events.

The ledger is an object, not module state: it registers listeners on start() and removes them on
close(). Every executable the process builds is counted: a backend compile, or a load from the
persistent compilation cache (which stands in for one). Both count for the step and for any stray
eager op, which is what "no compilation after warmup" must mean.
"""

from __future__ import annotations

import threading

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"


class CompileLedger:
  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._count = 0
    self._seconds = 0.0
    self._cache_hits = 0
    self._cache_misses = 0
    self._active = False

  def _listener(self, event: str, duration_secs: float, **_kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT:
      with self._lock:
        self._count += 1
        self._seconds += duration_secs

  def _event_listener(self, event: str, **_kwargs) -> None:
    if event == CACHE_HIT_EVENT:
      with self._lock:
        self._count += 1
        self._cache_hits += 1
    elif event == CACHE_MISS_EVENT:
      with self._lock:
        self._cache_misses += 1

  def start(self) -> CompileLedger:
    if not self._active:
      jax.monitoring.register_event_duration_secs_listener(self._listener)
      jax.monitoring.register_event_listener(self._event_listener)
      self._active = True
    return self

  def close(self) -> None:
    if self._active:
      jax.monitoring.unregister_event_duration_listener(self._listener)
      jax.monitoring.unregister_event_listener(self._event_listener)
      self._active = False

  @property
  def num_compilations(self) -> int:
    with self._lock:
      return self._count

  @property
  def cache_hits(self) -> int:
    """Executables loaded from the persistent compilation cache."""
    with self._lock:
      return self._cache_hits

  @property
  def cache_misses(self) -> int:
    """Executables looked up in the persistent compilation cache and compiled (0 without one)."""
    with self._lock:
      return self._cache_misses

  @property
  def compile_seconds(self) -> float:
    with self._lock:
      return self._seconds
