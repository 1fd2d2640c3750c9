"""The paged KV pool: how many pages fit a memory budget, how its slots stack into arrays, and the
arrays themselves.

Layout: the pool (attention/metadata.py KVPages) is a tuple of equal groups of slots, one
(k_pool, v_pool) pair a group, each [slots_per_group, num_kv_heads, num_pages, page_size,
head_dim], of the cache's storage dtype (CacheConfig.storage_dtype: the model's, or 8-bit
float8_e4m3fn / int8 pages of one byte an element, so a budget holds twice bfloat16's pages; the
static scales take no memory). The model's KV layout (models/kv_layout.py) sets the slot count m:
the layer count for one kind of layer, the global layers' for Gemma, whose sliding layers share the
slots in groups, so a page id names a page in all m slots and costs m layers' bytes. Slot j lives
in group j // slots_per_group at index j % slots_per_group (models/kv_layout.LayerKV). Page 0 is
the null page. The pool size comes from CacheConfig: an explicit page count, a byte budget, or the
device's budget for it (device/device_memory.py: memory_fraction of the device's total memory less
the weights and step scratch). On a backend that reports no memory statistics (CPU) the pool is
memory_fraction of CPU_DEFAULT_BYTES.

Groups (`group_pool`, the one owner of the rule): every donated array costs the host dispatch time
(docs/DECISIONS.md, "The KV pool as stacked arrays"), so the slots stack into as few arrays as the
kernels address. slots_per_group is the largest divisor c of m whose group array, one device's
part of it, is addressable: for a backend whose capabilities say large_page_arrays (the Pallas
Triton kernels) what pallas_kernels/ragged_paged_attention/gpu/addressing.py says (int32 offsets
under 2**31 elements, int64 ones past 2**32 bytes; only 8-bit arrays of 2**31 to 2**32 elements
are neither), so a large GPU pool is one group of every slot and an 8-bit one whose whole stack
falls in that gap takes smaller groups; for any other backend (XLA, the TPU Mosaic kernel, the
interpreter) at most 2**31 - 1 elements (MAX_ARRAY_ELEMENTS). When not even one slot's array is
addressable the page count is capped to what one slot's array holds (c = 1), with a warning, or a
ValueError when the config named the page count.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxserve.attention.metadata import KVPages
from jaxserve.config import CacheConfig, EngineConfig
from jaxserve.models.kv_layout import kv_layout
from jaxserve.models.model_config import ModelConfig
from pallas_kernels.ragged_paged_attention.gpu.addressing import INT32_MAX_ELEMENTS, addressable

CPU_DEFAULT_BYTES = 256 << 20
MAX_ARRAY_ELEMENTS = INT32_MAX_ELEMENTS  # int32 element offsets: what every backend addresses

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCacheSpec:
  num_slots: int  # m of the model's KV layout: the slots of all groups together
  num_kv_heads: int
  head_dim: int
  page_size: int
  num_pages: int
  dtype: str
  slots_per_group: int  # each group array's leading dimension (group_pool); divides num_slots

  def __post_init__(self) -> None:
    if self.slots_per_group < 1 or self.num_slots % self.slots_per_group:
      raise ValueError(
        f"slots_per_group: must divide num_slots {self.num_slots}, got {self.slots_per_group}"
      )

  @property
  def num_groups(self) -> int:
    """The (k_pool, v_pool) pairs of the pool (groups of slots, not the layout's KV groups)."""
    return self.num_slots // self.slots_per_group

  @property
  def bytes_per_page(self) -> int:
    return page_bytes(self.num_slots, self.num_kv_heads, self.head_dim, self.page_size, self.dtype)

  @property
  def total_bytes(self) -> int:
    return self.bytes_per_page * self.num_pages

  @property
  def group_shape(self) -> tuple[int, int, int, int, int]:
    """The shape of each group's K and V arrays."""
    return (self.slots_per_group, self.num_kv_heads, self.num_pages, self.page_size, self.head_dim)


@dataclass(frozen=True)
class PoolGroups:
  """How a pool's slots stack into arrays (group_pool): slots_per_group a divisor of the slot
  count, num_pages the page count, capped where not even one slot's array is addressable."""

  slots_per_group: int
  num_pages: int


def page_bytes(num_slots: int, num_kv_heads: int, head_dim: int, page_size: int, dtype: str) -> int:
  """Bytes of one page across all KV slots (m layers), K and V."""
  return 2 * num_slots * num_kv_heads * page_size * head_dim * jnp.dtype(dtype).itemsize


def plan_num_pages(config: CacheConfig, bytes_per_page: int, pool_bytes: int | None) -> int:
  """Number of pages (null page included) the config asks for; pool_bytes is the device's budget
  for the pool (device_memory.kv_pool_bytes, memory_fraction already applied), None on CPU."""
  if config.num_pages is not None:
    return config.num_pages
  budget = config.memory_bytes
  if budget is None:
    budget = (
      pool_bytes if pool_bytes is not None else int(CPU_DEFAULT_BYTES * config.memory_fraction)
    )
  num_pages = budget // bytes_per_page
  if num_pages < 2:
    raise ValueError(
      f"cache: a budget of {budget} bytes holds {num_pages} pages of "
      f"{bytes_per_page} bytes; need at least 2"
    )
  return int(num_pages)


def fits(num_elements: int, itemsize: int, large_page_arrays: bool, max_elements: int) -> bool:
  """Whether the backend's kernels address an array of num_elements items (module docstring);
  max_elements is MAX_ARRAY_ELEMENTS but for tests."""
  return num_elements <= max_elements or (large_page_arrays and addressable(num_elements, itemsize))


def largest_group(
  num_slots: int,
  slot_page_elements: int,
  itemsize: int,
  num_pages: int,
  large_page_arrays: bool,
  max_elements: int = MAX_ARRAY_ELEMENTS,
) -> int | None:
  """The largest divisor c of num_slots whose [c, heads, num_pages, page_size, head_dim] group
  array (slot_page_elements = one device's heads * page_size * head_dim) is addressable; None
  when none is."""
  for c in range(num_slots, 0, -1):
    if num_slots % c == 0 and fits(
      c * slot_page_elements * num_pages, itemsize, large_page_arrays, max_elements
    ):
      return c
  return None


def cap_to_addressable(
  num_pages: int,
  slot_page_elements: int,
  itemsize: int,
  asked: int | None,
  large_page_arrays: bool,
  max_elements: int = MAX_ARRAY_ELEMENTS,
) -> int:
  """num_pages when the backend's kernels address one device's [heads, pages, page_size,
  head_dim] array of one slot (module docstring), else the most pages whose array stays under
  max_elements: a warning when a memory budget asked for more, a ValueError naming
  cache.num_pages when the config did."""
  if fits(num_pages * slot_page_elements, itemsize, large_page_arrays, max_elements):
    return num_pages
  limit = max_elements // slot_page_elements
  reason = (
    "8-bit pages of 2**31 to 2**32 elements get int32 offsets in the Pallas Triton kernels"
    if large_page_arrays
    else "the attention backend is held to int32 offsets"
  )
  if asked is not None:
    raise ValueError(
      f"cache.num_pages: {asked} pages of {slot_page_elements} elements per slot array exceed "
      f"2**31 elements ({reason}); at most {limit}"
    )
  logger.warning(
    "KV pool capped at %d pages (the memory budget holds %d): a slot's K/V array stays under "
    "2**31 elements (%s)",
    limit,
    num_pages,
    reason,
  )
  return limit


def group_pool(
  num_slots: int,
  slot_page_elements: int,
  itemsize: int,
  num_pages: int,
  large_page_arrays: bool,
  asked: int | None = None,
  max_elements: int = MAX_ARRAY_ELEMENTS,
) -> PoolGroups:
  """The pool's groups of slots and page count (module docstring, "Groups"): the largest
  addressable divisor of num_slots at num_pages, else one slot a group with the pages capped
  (cap_to_addressable). slot_page_elements: one device's elements of one slot's page (its kv
  heads * page_size * head_dim); asked: the config's explicit page count, if any."""
  group = largest_group(
    num_slots, slot_page_elements, itemsize, num_pages, large_page_arrays, max_elements
  )
  if group is not None:
    return PoolGroups(group, num_pages)
  capped = cap_to_addressable(
    num_pages, slot_page_elements, itemsize, asked, large_page_arrays, max_elements
  )
  return PoolGroups(1, capped)


def kv_pool_spec(
  num_slots: int,
  num_kv_heads: int,
  head_dim: int,
  page_size: int,
  num_pages: int,
  dtype: str,
  num_shards: int = 1,
  large_page_arrays: bool = False,
  asked: int | None = None,
) -> KVCacheSpec:
  """The spec of a pool of num_pages pages (capped where group_pool caps them), its slots grouped
  by group_pool for one device's part (1/num_shards of the kv heads)."""
  heads_per_device = max(1, num_kv_heads // num_shards)
  groups = group_pool(
    num_slots,
    heads_per_device * page_size * head_dim,
    jnp.dtype(dtype).itemsize,
    num_pages,
    large_page_arrays,
    asked,
  )
  return KVCacheSpec(
    num_slots, num_kv_heads, head_dim, page_size, groups.num_pages, dtype, groups.slots_per_group
  )


def resolve_max_model_len(config: EngineConfig, model_config: ModelConfig) -> int:
  limit = model_config.max_position_embeddings
  if config.max_model_len is None:
    return limit
  if config.max_model_len > limit:
    raise ValueError(
      f"max_model_len: {config.max_model_len} exceeds the model's max_position_embeddings {limit}"
    )
  return config.max_model_len


def kv_cache_spec(
  config: EngineConfig,
  model_config: ModelConfig,
  max_model_len: int,
  free_bytes: int | None,
  num_shards: int = 1,
  large_page_arrays: bool = False,
) -> KVCacheSpec:
  """The pool's spec; free_bytes is one device's budget for the pool (memory_fraction applied,
  device/device_memory.py), that device holding 1/num_shards of every page; large_page_arrays:
  the attention backend's capability of that name (module docstring)."""
  page_size = config.cache.page_size
  kv_dtype = config.cache.storage_dtype(model_config.dtype)
  layout = kv_layout(model_config, page_size)
  per_page = (
    page_bytes(
      layout.num_slots,
      model_config.num_kv_heads,
      model_config.head_dim,
      page_size,
      kv_dtype,
    )
    // num_shards
  )
  num_pages = plan_num_pages(config.cache, per_page, free_bytes)
  if free_bytes is None and config.cache.num_pages is None and config.cache.memory_bytes is None:
    scheduler = config.scheduler
    chunk = max(scheduler.max_num_batched_tokens, scheduler.num_scheduler_steps)
    enough = scheduler.max_num_seqs * layout.max_pages(max_model_len, chunk) + 1
    num_pages = min(num_pages, enough)
  return kv_pool_spec(
    layout.num_slots,
    model_config.num_kv_heads,
    model_config.head_dim,
    page_size,
    num_pages,
    kv_dtype,
    num_shards,
    large_page_arrays,
    config.cache.num_pages,
  )


def pages_for_tokens(num_tokens: int, page_size: int) -> int:
  return math.ceil(num_tokens / page_size)


def kv_pool_shapes(
  spec: KVCacheSpec, sharding: jax.sharding.Sharding | None = None
) -> tuple[tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct], ...]:
  """The pool as abstract values (lowering without allocating it): num_groups (k, v) pairs of
  spec.group_shape."""
  group = jax.ShapeDtypeStruct(spec.group_shape, jnp.dtype(spec.dtype), sharding=sharding)
  return tuple((group, group) for _ in range(spec.num_groups))


class KVPoolMaker:
  """The zero-filled pool of one spec, num_groups (k_pool, v_pool) pairs, from one jitted program,
  kept: the pool re-created after sleep mode discarded it (device/sleep_mode.py) runs the
  executable the first allocation compiled, so waking compiles nothing."""

  def __init__(self, spec: KVCacheSpec, sharding: jax.sharding.Sharding | None = None):
    def zeros():
      return jnp.zeros(spec.group_shape, spec.dtype)  # [slots_per_group, KVH, pages, page_size, D]

    self._zeros = jax.jit(zeros, out_shardings=sharding) if sharding is not None else jax.jit(zeros)
    self._num_groups = spec.num_groups

  def __call__(self) -> KVPages:
    return tuple((self._zeros(), self._zeros()) for _ in range(self._num_groups))


def allocate_kv_pages(spec: KVCacheSpec, sharding: jax.sharding.Sharding | None = None) -> KVPages:
  """The zero-filled pool, created directly on the device (or its shards)."""
  return KVPoolMaker(spec, sharding)()
