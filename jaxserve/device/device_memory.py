"""How much accelerator memory the KV pool gets.

Policy (vLLM's gpu_memory_utilization): `cache.memory_fraction` is the share of the device's
TOTAL memory this process may use. The KV pool gets what that share leaves after the weights
(and the loader's slack, below) and the largest step's scratch:

    pool = min(fraction * total, client limit) - weights - loader slack - step scratch - headroom

Run-invariant size. The page count is part of the forward programs' shapes, so the pool's size is
a function of run-invariant quantities only (kv_budget_bytes) and a restart finds its forward
programs in the compile cache: "in use" is the weights' bytes on one device, from their shapes,
dtypes and shardings (not the allocator's live count), plus a slack for what the weight loader
leaves behind: LOADER_SLACK_SHARE of them when its transient buffers left holes between the
weights, PACKED_LOADER_SLACK_SHARE when it laid them out with none (models/packed_layout.py, the
"packed" layout, in one group or, when the raw and twice the converted weights do not fit at
once, in several that lie end to end: GPUs of one host where each leaf's raw tensors and twice
its converted bytes fit beside the weights, decided before loading, when the free memory is the
client's limit less what the process allocated before the weights: nearly nothing). The packed
load's transients (a group's raw tensors and margin) are all freed into the block after the
weights before the pool is sized, so they cost it nothing. Each share covers, with the headroom,
the holes and leftovers its layout leaves (the measurements: docs/DECISIONS.md).
Where the client reports its largest free block in an arena reserved whole (JAX's pre-allocation;
a growing one, XLA_PYTHON_CLIENT_PREALLOCATE=false, reports the block of the regions it has so far
and adds regions up to its limit: no bound), fit_pool_bytes checks the planned pool (its
layers are allocated one after another in what is left of the arena) against it, less the scratch
and ARENA_MIN_HEADROOM; a pool that does not fit is shrunk by whole 64ths of itself until it does,
with a warning (a deterministic step, so restarts that shrink usually agree, but the compile cache
may miss).
The headroom (ARENA_HEADROOM_SHARE of the usable bytes, at least ARENA_MIN_HEADROOM) is what
the allocator needs beyond the sum of the buffers: each layer's K or V pages are one contiguous
buffer, the weight loader's transient buffers leave the arena fragmented, and a step's inputs and
outputs live beside its scratch; a pool sized to the arena's last bytes does not allocate.

The JAX client's share of the device (XLA_CLIENT_MEM_FRACTION, set from cache.memory_fraction
before the backend starts) is device/client_memory.py's; device_memory() reads the device's total
from the client's limit and that share. Backends with no memory statistics (CPU) size the pool
from memory_fraction of CPU_DEFAULT_BYTES (device/kv_cache.py). The step scratch is measured for
unsharded steps (composition/assembly.py); for sharded ones UNMEASURED_SCRATCH_SHARE of the budget
is kept instead. Statistics are read through jaxserve/runtime/memory_stats.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from jaxserve.device.client_memory import client_share
from jaxserve.runtime.device_description import DeviceDescription
from jaxserve.runtime.memory_stats import memory_stats

logger = logging.getLogger(__name__)

GIB = 2**30
UNMEASURED_SCRATCH_SHARE = 0.1  # of the budget, when the step's scratch is not measured
ARENA_HEADROOM_SHARE = 0.02  # of the usable bytes, kept free for the allocator
ARENA_MIN_HEADROOM = GIB // 2
LOADER_SLACK_SHARE = 0.25  # of the weights' bytes: the loader's holes and leftovers
PACKED_LOADER_SLACK_SHARE = 0.01  # the same, weights loaded in the packed layout
SHRINK_STEPS = 64  # a planned pool that does not fit shrinks by 1/64ths of itself


@dataclass(frozen=True)
class DeviceMemory:
  """One device's memory as the JAX client sees it when the pool is sized."""

  total_bytes: int  # the device's memory
  limit_bytes: int  # what the client may allocate (its arena)
  in_use_bytes: int  # live now: weights and anything else
  largest_free_bytes: int | None = None  # the arena's largest free block, where reported


def device_memory(
  stats: Mapping[str, int] | None, platform: str, environ: Mapping[str, str]
) -> DeviceMemory | None:
  """DeviceMemory from a device's memory_stats(), or None if it reports no limit (CPU)."""
  if not stats or "bytes_limit" not in stats:
    return None
  limit = int(stats["bytes_limit"])
  total = int(limit / client_share(platform, environ))
  largest = stats.get("largest_free_block_bytes")
  if int(stats.get("pool_bytes", limit)) < limit:
    largest = None  # a growing arena (no pre-allocation) adds regions up to its limit
  return DeviceMemory(
    total, limit, int(stats.get("bytes_in_use", 0)), None if largest is None else int(largest)
  )


def arena_headroom(usable_bytes: int) -> int:
  """Bytes of the usable share kept free for the allocator (see the module docstring)."""
  return max(ARENA_MIN_HEADROOM, int(usable_bytes * ARENA_HEADROOM_SHARE))


def kv_pool_bytes(memory: DeviceMemory, fraction: float, scratch_bytes: int = 0) -> int:
  """fraction of the total, capped at the client's limit, less what is live, the scratch and
  the allocator's headroom."""
  usable = min(int(fraction * memory.total_bytes), memory.limit_bytes)
  pool = usable - memory.in_use_bytes - scratch_bytes - arena_headroom(usable)
  if memory.largest_free_bytes is not None:  # the pool's layers are allocated in that block
    pool = min(pool, memory.largest_free_bytes - scratch_bytes - ARENA_MIN_HEADROOM)
  return pool


def max_concurrency(
  num_pages: int, page_size: int, max_model_len: int, pages_held: int | None = None
) -> float:
  """Requests of max_model_len tokens the pool holds at once (page 0 is the null page).
  pages_held: the pages such a request holds when sliding-window layers free theirs
  (KVLayout.pages_held; None: one KV group, every token kept)."""
  if pages_held is not None:
    return (num_pages - 1) / pages_held
  return (num_pages - 1) * page_size / max_model_len


def read_device_memory(
  environ: Mapping[str, str] | None = None, device=None
) -> DeviceMemory | None:
  """`device`'s DeviceMemory, by default the first device's (jax must be usable; None on CPU)."""
  import jax

  device = jax.devices()[0] if device is None else device
  return device_memory(
    memory_stats(device), device.platform, os.environ if environ is None else environ
  )


def describe_devices(device_count: int = 1) -> DeviceDescription:
  """The first device's platform, kind and total memory (0 where the client reports none: the
  CPU), for an engine on `device_count` such devices (jaxserve/config/device_defaults.py's
  input)."""
  import jax

  device = jax.devices()[0]
  memory = read_device_memory(device=device)
  return DeviceDescription.of(device, 0 if memory is None else memory.total_bytes, device_count)


def unmeasured_scratch_bytes(budget: int) -> int:
  """Headroom kept for a step whose scratch is not measured (sharded steps, for now)."""
  return int(max(budget, 0) * UNMEASURED_SCRATCH_SHARE)


def kv_budget(memory: DeviceMemory, fraction: float, *, scratch_measured: bool = True) -> int:
  """The pool's bytes on a device of `memory`: kv_pool_bytes, less UNMEASURED_SCRATCH_SHARE of it
  unless the caller measures and subtracts the step scratch (scratch_measured). Pure: what
  kv_budget_bytes does with this device's statistics, and jaxserve/tpu_aot with a TPU chip's."""
  budget = kv_pool_bytes(memory, fraction)
  return budget if scratch_measured else budget - unmeasured_scratch_bytes(budget)


def loader_slack(weight_bytes: int, packed: bool = False) -> int:
  """Bytes the weight loader leaves unusable for the pool (holes, leftovers; module docstring)."""
  return int(weight_bytes * (PACKED_LOADER_SLACK_SHARE if packed else LOADER_SLACK_SHARE))


def planned_memory(memory: DeviceMemory, weight_bytes: int, packed: bool = False) -> DeviceMemory:
  """`memory` with the live counts replaced by run-invariant ones: the weights' bytes plus the
  loader's slack in use, no largest free block."""
  return DeviceMemory(
    memory.total_bytes, memory.limit_bytes, weight_bytes + loader_slack(weight_bytes, packed)
  )


def fit_pool_bytes(pool_bytes: int, largest_free_bytes: int | None, scratch_bytes: int) -> int:
  """pool_bytes if it fits the arena's largest free block (less scratch and ARENA_MIN_HEADROOM),
  else pool_bytes less the fewest SHRINK_STEPS-ths of it that make it fit (logged: a restart may
  then compile the forwards)."""
  if largest_free_bytes is None:
    return pool_bytes
  room = largest_free_bytes - scratch_bytes - ARENA_MIN_HEADROOM
  if pool_bytes <= room:
    return pool_bytes
  step = max(pool_bytes // SHRINK_STEPS, 1)
  shrunk = pool_bytes - -(-(pool_bytes - room) // step) * step
  logger.warning(
    "device memory: the planned KV pool (%.2f GiB) does not fit the largest free "
    "block (%.2f GiB less %.2f GiB of scratch and headroom); shrunk to %.2f GiB. "
    "The pool's size then depends on how the weights were laid out, so a restart "
    "may compile the forward programs again: lower cache.memory_fraction",
    pool_bytes / GIB,
    largest_free_bytes / GIB,
    (scratch_bytes + ARENA_MIN_HEADROOM) / GIB,
    shrunk / GIB,
  )
  return shrunk


def kv_budget_bytes(
  fraction: float, weight_bytes: int, *, packed: bool = False, scratch_measured: bool = True
) -> tuple[int, DeviceMemory] | None:
  """kv_budget on this process's first device, from run-invariant quantities (its total memory,
  the client's limit, `weight_bytes` on one device from the params' shapes), logged, with the
  live DeviceMemory (for fit_pool_bytes); None without memory statistics."""
  memory = read_device_memory()
  if memory is None:
    return None
  planned = planned_memory(memory, weight_bytes, packed)
  budget = kv_pool_bytes(planned, fraction)
  logger.info(
    "device memory: %.1f GiB total x %g = %.1f GiB (client limit %.1f GiB), "
    "%.2f GiB of weights + %.2f GiB loader slack, %.1f GiB left for the KV pool and "
    "step scratch",
    memory.total_bytes / GIB,
    fraction,
    fraction * memory.total_bytes / GIB,
    memory.limit_bytes / GIB,
    weight_bytes / GIB,
    loader_slack(weight_bytes, packed) / GIB,
    budget / GIB,
  )
  if memory.largest_free_bytes is not None:
    logger.info(
      "device memory: largest free block %.1f GiB (%.1f GiB free in all, %.2f GiB in use)",
      memory.largest_free_bytes / GIB,
      (memory.limit_bytes - memory.in_use_bytes) / GIB,
      memory.in_use_bytes / GIB,
    )
  if not scratch_measured:
    logger.info(
      "step scratch memory: %.2f GiB kept (%.0f%%, not measured for sharded steps)",
      unmeasured_scratch_bytes(budget) / GIB,
      UNMEASURED_SCRATCH_SHARE * 100,
    )
  return kv_budget(planned, fraction, scratch_measured=scratch_measured), memory
