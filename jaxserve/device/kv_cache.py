"""The paged KV pool: how many pages fit a memory budget, and the arrays themselves.

Layout: the stacked pool (k_pool, v_pool) (attention/metadata.py KVPages), each [num_slots,
num_kv_heads, num_pages, page_size, head_dim], of the cache's storage dtype
(CacheConfig.storage_dtype: the model's, or 8-bit float8_e4m3fn / int8 pages of one byte an element,
so a budget holds twice bfloat16's pages; the static scales take no memory). The model's KV layout
(models/kv_layout.py) sets the slot count m: the layer count for one kind of layer, the global
layers' for Gemma, whose sliding layers share the slots in groups, so a page id names a page in all
m slots and costs m layers' bytes. Page 0 is the null page. The pool size comes from CacheConfig: an
explicit page count, a byte budget, or the device's budget for it (device/device_memory.py:
memory_fraction of the device's total memory less the weights and step scratch). On a backend
that reports no memory statistics (CPU) the pool is memory_fraction of CPU_DEFAULT_BYTES.

Addressing: a backend whose capabilities say large_page_arrays (the Pallas Triton kernels) takes
whatever page count the budget holds as long as its kernels address one device's part of the
stacked K (or V) array, every slot included, exactly
(pallas_kernels/ragged_paged_attention/gpu/addressing.py: int32 offsets under 2**31 elements,
int64 ones past 2**32 bytes; only 8-bit pools of 2**31 to 2**32 elements are neither). Any other
pool, and an 8-bit one in that gap, stays under 2**31 elements an array (MAX_ARRAY_ELEMENTS, all
slots together), capped there with a warning.
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
  num_slots: int  # the stacked arrays' leading dimension: m of the model's KV layout
  num_kv_heads: int
  head_dim: int
  page_size: int
  num_pages: int
  dtype: str

  @property
  def bytes_per_page(self) -> int:
    return page_bytes(self.num_slots, self.num_kv_heads, self.head_dim, self.page_size, self.dtype)

  @property
  def total_bytes(self) -> int:
    return self.bytes_per_page * self.num_pages

  @property
  def pool_shape(self) -> tuple[int, int, int, int, int]:
    """The shape of each of the stacked K and V arrays."""
    return (self.num_slots, self.num_kv_heads, self.num_pages, self.page_size, self.head_dim)


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


def cap_to_addressable(
  num_pages: int,
  elements_per_page: int,
  itemsize: int,
  asked: int | None,
  large_page_arrays: bool,
) -> int:
  """num_pages when the backend's kernels address one device's stacked [slots, heads, pages,
  page_size, head_dim] array of them (module docstring; elements_per_page counts every slot),
  else the most pages whose array stays under MAX_ARRAY_ELEMENTS: a warning when a memory budget
  asked for more, a ValueError naming cache.num_pages when the config did."""
  if large_page_arrays and addressable(num_pages * elements_per_page, itemsize):
    return num_pages
  limit = MAX_ARRAY_ELEMENTS // elements_per_page
  if num_pages <= limit:
    return num_pages
  reason = (
    "8-bit pools of 2**31 to 2**32 elements get int32 offsets in the Pallas Triton kernels"
    if large_page_arrays
    else "the attention backend is held to int32 offsets"
  )
  if asked is not None:
    raise ValueError(
      f"cache.num_pages: {asked} pages of {elements_per_page} elements in the K (V) pool exceed "
      f"2**31 elements ({reason}); at most {limit}"
    )
  logger.warning(
    "KV pool capped at %d pages (the memory budget holds %d): the stacked K/V array stays under "
    "2**31 elements (%s)",
    limit,
    num_pages,
    reason,
  )
  return limit


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
  heads_per_device = max(1, model_config.num_kv_heads // num_shards)
  num_pages = cap_to_addressable(
    num_pages,
    layout.num_slots * heads_per_device * page_size * model_config.head_dim,
    jnp.dtype(kv_dtype).itemsize,
    config.cache.num_pages,
    large_page_arrays,
  )
  if free_bytes is None and config.cache.num_pages is None and config.cache.memory_bytes is None:
    scheduler = config.scheduler
    chunk = max(scheduler.max_num_batched_tokens, scheduler.num_scheduler_steps)
    enough = scheduler.max_num_seqs * layout.max_pages(max_model_len, chunk) + 1
    num_pages = min(num_pages, enough)
  return KVCacheSpec(
    layout.num_slots,
    model_config.num_kv_heads,
    model_config.head_dim,
    page_size,
    num_pages,
    kv_dtype,
  )


def pages_for_tokens(num_tokens: int, page_size: int) -> int:
  return math.ceil(num_tokens / page_size)


class KVPoolMaker:
  """The zero-filled stacked pool (k_pool, v_pool) of one spec from one jitted program, kept: the
  pool re-created after sleep mode discarded it (device/sleep_mode.py) runs the executable the
  first allocation compiled, so waking compiles nothing."""

  def __init__(self, spec: KVCacheSpec, sharding: jax.sharding.Sharding | None = None):
    def zeros():
      return jnp.zeros(spec.pool_shape, spec.dtype)  # [num_slots, KVH, num_pages, page_size, D]

    self._zeros = jax.jit(zeros, out_shardings=sharding) if sharding is not None else jax.jit(zeros)

  def __call__(self) -> KVPages:
    return (self._zeros(), self._zeros())


def allocate_kv_pages(spec: KVCacheSpec, sharding: jax.sharding.Sharding | None = None) -> KVPages:
  """The zero-filled stacked pool, created directly on the device (or its shards)."""
  return KVPoolMaker(spec, sharding)()
