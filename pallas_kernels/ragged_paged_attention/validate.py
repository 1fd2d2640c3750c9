"""Shape checks shared by every ragged paged-attention wrapper: bad shapes raise ValueError."""

from __future__ import annotations

import jax
import jax.numpy as jnp

SUPPORTED_HEAD_DIMS = (64, 128, 256)


def _fail(name: str, message: str) -> None:
  raise ValueError(f"ragged_paged_attention: {name}: {message}")


POOL_SHAPE = "[num_slots, num_kv_heads, num_pages, page_size, head_dim]"


def _check_pools(k_pool: jax.Array, v_pool: jax.Array, kv_slot: jax.Array, fail) -> None:
  """The stacked pools are equal 5-D arrays and kv_slot is int32[1]."""
  if k_pool.ndim != 5:
    fail("k_pool", f"expected {POOL_SHAPE}, got {k_pool.shape}")
  if v_pool.shape != k_pool.shape:
    fail("v_pool", f"shape {v_pool.shape} differs from k_pool {k_pool.shape}")
  if k_pool.dtype != v_pool.dtype:
    fail("v_pool", f"dtype {v_pool.dtype} differs from k_pool {k_pool.dtype}")
  if kv_slot.shape != (1,) or kv_slot.dtype != jnp.int32:
    fail("kv_slot", f"expected int32[1], got {kv_slot.dtype}{list(kv_slot.shape)}")


def validate_attention_inputs(
  q: jax.Array,
  k_pool: jax.Array,
  v_pool: jax.Array,
  kv_slot: jax.Array,
  block_tables: jax.Array,
  seq_lens: jax.Array,
  query_start_loc: jax.Array,
  num_seqs: jax.Array,
  *,
  sliding_window: int | None = None,
  soft_cap: float | None = None,
  head_dims: tuple[int, ...] | None = None,
) -> None:
  """Raises ValueError naming the argument whose shape, dtype or value is wrong."""
  if q.ndim != 3:
    _fail("q", f"expected [num_tokens, num_q_heads, head_dim], got shape {q.shape}")
  _check_pools(k_pool, v_pool, kv_slot, _fail)
  _, num_q_heads, head_dim = q.shape
  _, num_kv_heads, _, page_size, kv_head_dim = k_pool.shape
  if kv_head_dim != head_dim:
    _fail("k_pool", f"head_dim {kv_head_dim} differs from q's {head_dim}")
  if head_dims is not None and head_dim not in head_dims:
    _fail("q", f"head_dim {head_dim} not supported (supported: {head_dims})")
  if num_q_heads % num_kv_heads:
    _fail("q", f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
  if page_size <= 0 or page_size & (page_size - 1):
    _fail("k_pool", f"page_size {page_size} is not a power of two")
  if block_tables.ndim != 2:
    _fail("block_tables", f"expected [num_seqs, pages_per_seq], got {block_tables.shape}")
  num_seq_slots = block_tables.shape[0]
  if seq_lens.shape != (num_seq_slots,):
    _fail("seq_lens", f"expected shape ({num_seq_slots},), got {seq_lens.shape}")
  if query_start_loc.shape != (num_seq_slots + 1,):
    _fail("query_start_loc", f"expected shape ({num_seq_slots + 1},), got {query_start_loc.shape}")
  if num_seqs.shape != (1,):
    _fail("num_seqs", f"expected shape (1,), got {num_seqs.shape}")
  for name, array in (
    ("block_tables", block_tables),
    ("seq_lens", seq_lens),
    ("query_start_loc", query_start_loc),
    ("num_seqs", num_seqs),
  ):
    if array.dtype != jnp.int32:
      _fail(name, f"expected int32, got {array.dtype}")
  if sliding_window is not None and sliding_window < 1:
    _fail("sliding_window", f"must be >= 1, got {sliding_window}")
  if soft_cap is not None and soft_cap <= 0:
    _fail("soft_cap", f"must be > 0, got {soft_cap}")


def _fail_write(name: str, message: str) -> None:
  raise ValueError(f"write_kv: {name}: {message}")


def validate_write_inputs(
  k_pool: jax.Array,
  v_pool: jax.Array,
  kv_slot: jax.Array,
  new_k: jax.Array,
  new_v: jax.Array,
  slot_mapping: jax.Array,
) -> None:
  """Raises ValueError naming the argument whose shape or dtype is wrong."""
  _check_pools(k_pool, v_pool, kv_slot, _fail_write)
  _, num_kv_heads, _, _, head_dim = k_pool.shape
  if new_k.ndim != 3 or new_k.shape[1:] != (num_kv_heads, head_dim):
    _fail_write("new_k", f"expected [num_tokens, {num_kv_heads}, {head_dim}], got {new_k.shape}")
  if new_v.shape != new_k.shape:
    _fail_write("new_v", f"shape {new_v.shape} differs from new_k {new_k.shape}")
  if slot_mapping.shape != new_k.shape[:1] or slot_mapping.dtype != jnp.int32:
    _fail_write(
      "slot_mapping",
      f"expected int32[{new_k.shape[0]}], got {slot_mapping.dtype}{list(slot_mapping.shape)}",
    )
