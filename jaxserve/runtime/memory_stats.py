"""A device's memory statistics as its JAX client reports them, read without raising.

The one place that calls `device.memory_stats()`: the KV pool's sizing (device/device_memory.py)
and the weight loader's choice of layout (models/weight_transfer.py) both read them here, so
neither package imports the other for it. Imports nothing (the device is passed in).
"""

from __future__ import annotations

from collections.abc import Mapping


def memory_stats(device) -> Mapping[str, int] | None:
  """`device.memory_stats()`, or None where the backend reports none (the CPU) or raises."""
  try:
    return device.memory_stats()
  except Exception:  # some backends raise instead of returning None
    return None


def free_bytes(device) -> int | None:
  """What the client may still allocate on `device`: its limit less the bytes in use; None
  where it reports no limit."""
  stats = memory_stats(device)
  if not stats or "bytes_limit" not in stats:
    return None
  return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
