"""The paged KV pool: how many pages fit a memory budget, and the arrays themselves.

Layout: one (k_pages, v_pages) pair per layer, each [num_kv_heads, num_pages, page_size,
head_dim]. Page 0 is the null page. The pool size comes from CacheConfig: an explicit page count,
a byte budget, or the device's budget for it (jaxserve/device_memory.py: memory_fraction of the
device's total memory less the weights and step scratch). On a backend that reports no memory
statistics (CPU) the pool is memory_fraction of CPU_DEFAULT_BYTES.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxserve.config import CacheConfig

CPU_DEFAULT_BYTES = 256 << 20
KVPages = tuple[tuple[jax.Array, jax.Array], ...]


@dataclass(frozen=True)
class KVCacheSpec:
  num_layers: int
  num_kv_heads: int
  head_dim: int
  page_size: int
  num_pages: int
  dtype: str

  @property
  def bytes_per_page(self) -> int:
    return page_bytes(self.num_layers, self.num_kv_heads, self.head_dim, self.page_size, self.dtype)

  @property
  def total_bytes(self) -> int:
    return self.bytes_per_page * self.num_pages

  @property
  def page_shape(self) -> tuple[int, int, int, int]:
    return (self.num_kv_heads, self.num_pages, self.page_size, self.head_dim)


def page_bytes(num_layers: int, num_kv_heads: int, head_dim: int, page_size: int,
               dtype: str) -> int:
  """Bytes of one page across all layers, K and V."""
  return 2 * num_layers * num_kv_heads * page_size * head_dim * jnp.dtype(dtype).itemsize


def plan_num_pages(config: CacheConfig, bytes_per_page: int, pool_bytes: int | None) -> int:
  """Number of pages (null page included) the config asks for; pool_bytes is the device's budget
  for the pool (device_memory.kv_pool_bytes, memory_fraction already applied), None on CPU."""
  if config.num_pages is not None:
    return config.num_pages
  budget = config.memory_bytes
  if budget is None:
    budget = pool_bytes if pool_bytes is not None else int(CPU_DEFAULT_BYTES
                                                           * config.memory_fraction)
  num_pages = budget // bytes_per_page
  if num_pages < 2:
    raise ValueError(f"cache: a budget of {budget} bytes holds {num_pages} pages of "
                     f"{bytes_per_page} bytes; need at least 2")
  return int(num_pages)


def pages_for_tokens(num_tokens: int, page_size: int) -> int:
  return math.ceil(num_tokens / page_size)


def allocate_kv_pages(spec: KVCacheSpec, sharding: jax.sharding.Sharding | None = None) -> KVPages:
  """Zero-filled pages for every layer, created directly on the device (or its shards)."""
  def zeros():
    return jnp.zeros(spec.page_shape, spec.dtype)
  make = jax.jit(zeros, out_shardings=sharding) if sharding is not None else jax.jit(zeros)
  return tuple((make(), make()) for _ in range(spec.num_layers))
