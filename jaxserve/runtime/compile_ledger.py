"""Counts XLA compilations through jax.monitoring's backend-compile event.

The ledger is an object, not module state: it registers a listener on start() and removes it on
close(). Every backend compile in the process is counted (the step, and any stray eager op), which
is what "no compilation after warmup" must mean.
"""
from __future__ import annotations

import threading

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileLedger:
  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._count = 0
    self._seconds = 0.0
    self._active = False

  def _listener(self, event: str, duration_secs: float, **_kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT:
      with self._lock:
        self._count += 1
        self._seconds += duration_secs

  def start(self) -> "CompileLedger":
    if not self._active:
      jax.monitoring.register_event_duration_secs_listener(self._listener)
      self._active = True
    return self

  def close(self) -> None:
    if self._active:
      jax.monitoring.unregister_event_duration_listener(self._listener)
      self._active = False

  @property
  def num_compilations(self) -> int:
    with self._lock:
      return self._count

  @property
  def compile_seconds(self) -> float:
    with self._lock:
      return self._seconds
