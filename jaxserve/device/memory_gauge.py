"""DeviceMemoryGauge: the bytes the engine's JAX client holds on its devices, for /metrics.

`bytes_in_use` sums `memory_stats()["bytes_in_use"]` over the engine's devices (read through
jaxserve/runtime/memory_stats.py): the weights, the KV pool and whatever live buffers the steps
hold, i.e. what would grow if something leaked on the device (the arena JAX reserves up front does
not move). It is read at most once per `interval_s`, since the engine asks for its stats after every
step; 0 where the backend reports none (the CPU). Implements engine/device_port.py's MemoryGauge.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax

from jaxserve.runtime.memory_stats import memory_stats


class DeviceMemoryGauge:
  def __init__(self, devices: Sequence[jax.Device], interval_s: float = 1.0):
    if interval_s < 0:
      raise ValueError(f"interval_s: must be >= 0, got {interval_s}")
    self._devices = tuple(devices)
    self._interval_s = interval_s
    self._read_at = -float("inf")
    self._value = 0

  @property
  def bytes_in_use(self) -> int:
    now = time.monotonic()
    if now - self._read_at >= self._interval_s:
      self._read_at, self._value = now, self._read()
    return self._value

  def _read(self) -> int:
    total = 0
    for device in self._devices:
      stats = memory_stats(device)
      total += int(stats.get("bytes_in_use", 0)) if stats else 0
    return total
