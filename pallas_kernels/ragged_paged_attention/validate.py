"""Shape checks shared by every ragged paged-attention wrapper: bad shapes raise ValueError."""

from __future__ import annotations

import jax
import jax.numpy as jnp

SUPPORTED_HEAD_DIMS = (64, 128, 256)


def _fail(name: str, message: str) -> None:
  raise ValueError(f"ragged_paged_attention: {name}: {message}")


def validate_attention_inputs(
  q: jax.Array,
  k_pages: jax.Array,
  v_pages: jax.Array,
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
  if k_pages.ndim != 4:
    _fail(
      "k_pages", f"expected [num_kv_heads, num_pages, page_size, head_dim], got {k_pages.shape}"
    )
  if v_pages.shape != k_pages.shape:
    _fail("v_pages", f"shape {v_pages.shape} differs from k_pages {k_pages.shape}")
  if k_pages.dtype != v_pages.dtype:
    _fail("v_pages", f"dtype {v_pages.dtype} differs from k_pages {k_pages.dtype}")
  _, num_q_heads, head_dim = q.shape
  num_kv_heads, _, page_size, kv_head_dim = k_pages.shape
  if kv_head_dim != head_dim:
    _fail("k_pages", f"head_dim {kv_head_dim} differs from q's {head_dim}")
  if head_dims is not None and head_dim not in head_dims:
    _fail("q", f"head_dim {head_dim} not supported (supported: {head_dims})")
  if num_q_heads % num_kv_heads:
    _fail("q", f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
  if page_size <= 0 or page_size & (page_size - 1):
    _fail("k_pages", f"page_size {page_size} is not a power of two")
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


def validate_write_inputs(
  k_pages: jax.Array,
  v_pages: jax.Array,
  new_k: jax.Array,
  new_v: jax.Array,
  slot_mapping: jax.Array,
) -> None:
  """Raises ValueError naming the argument whose shape or dtype is wrong."""
  if k_pages.ndim != 4 or v_pages.shape != k_pages.shape:
    raise ValueError(
      f"write_kv: k_pages/v_pages: expected equal "
      f"[num_kv_heads, num_pages, page_size, head_dim], got {k_pages.shape} "
      f"and {v_pages.shape}"
    )
  num_kv_heads, _, _, head_dim = k_pages.shape
  if new_k.ndim != 3 or new_k.shape[1:] != (num_kv_heads, head_dim):
    raise ValueError(
      f"write_kv: new_k: expected [num_tokens, {num_kv_heads}, {head_dim}], got {new_k.shape}"
    )
  if new_v.shape != new_k.shape:
    raise ValueError(f"write_kv: new_v: shape {new_v.shape} differs from new_k {new_k.shape}")
  if slot_mapping.shape != new_k.shape[:1] or slot_mapping.dtype != jnp.int32:
    raise ValueError(
      f"write_kv: slot_mapping: expected int32[{new_k.shape[0]}], "
      f"got {slot_mapping.dtype}{list(slot_mapping.shape)}"
    )
