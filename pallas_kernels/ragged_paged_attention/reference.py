"""Pure-jnp reference for ragged paged attention and the paged KV write.

This is the ground truth every kernel is tested against, and the attention path the engine uses
on CPU. It gathers each token's sequence of K/V pages into a contiguous copy and attends densely,
so memory grows as num_tokens * pages_per_seq * page_size; fine on CPU and as the XLA baseline,
not what the kernels do.

KV layout: the stacked pool k_pool, v_pool: [num_slots, num_kv_heads, num_pages, page_size,
head_dim], one KV slot per layer (or per group of layers that share one); kv_slot int32[1] names the
slot a call reads or writes (a traced value: one compiled program serves every layer), and the other
slots are left untouched. kv_slot must lie in [0, num_slots): the reference clamps reads and drops
writes outside it, the kernels do not check. Page 0 is the null page: padding tokens write there and
no block table of a live sequence uses it. 8-bit pages (float8_e4m3fn, int8) hold K / k_scale and V
/ v_scale (kv_quant.py): the write quantizes, the attention reads float32(page) * scale.

Batch layout (ragged): the query tokens of sequence i are
q[query_start_loc[i]:query_start_loc[i+1]]. seq_lens[i] counts every token of sequence i in the
cache *after* this step's K/V were written, so the j-th query token of sequence i sits at position
seq_lens[i] - q_len_i + j and attends to cache positions max(0, pos - sliding_window + 1) .. pos.
A page that lies wholly before the window of every query of its sequence is never needed: its
block-table entry may be the null page (every variant gives bitwise the same output), so a
scheduler may free it.
Sequences i >= num_seqs[0] are padding; tokens at or past query_start_loc[num_seqs[0]] are padding
and produce zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.ragged_paged_attention.kv_quant import check_scales, dequantize_kv, quantize_kv

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def token_positions(
  query_start_loc: jax.Array, seq_lens: jax.Array, num_seqs: jax.Array, num_tokens: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Returns (seq_ids[T], positions[T], valid[T]) for every query token of a ragged batch."""
  num_seq_slots = seq_lens.shape[0]
  token_idx = jnp.arange(num_tokens, dtype=jnp.int32)  # [T]
  seq_ids = jnp.searchsorted(query_start_loc[1:], token_idx, side="right")  # [T]
  seq_ids = jnp.clip(seq_ids, 0, num_seq_slots - 1).astype(jnp.int32)
  valid = token_idx < query_start_loc[num_seqs[0]]  # [T]
  q_lens = query_start_loc[seq_ids + 1] - query_start_loc[seq_ids]  # [T]
  positions = seq_lens[seq_ids] - q_lens + (token_idx - query_start_loc[seq_ids])  # [T]
  return seq_ids, positions, valid


def gather_pages(pool: jax.Array, kv_slot: jax.Array, pages: jax.Array) -> jax.Array:
  """pool [num_slots, KVH, num_pages, page_size, D], kv_slot int32[1], pages int32[*idx] ->
  [KVH, *idx, page_size, D]: the pages of slot kv_slot, gathered straight from the stack (one
  gather, no copy of the slot)."""
  gathered = pool[kv_slot[0], :, pages]  # [*idx, KVH, page_size, D]
  return jnp.moveaxis(gathered, pages.ndim, 0)


def ragged_paged_attention_reference(
  q: jax.Array,  # [T, num_q_heads, head_dim]
  k_pool: jax.Array,  # [num_slots, num_kv_heads, num_pages, page_size, head_dim]
  v_pool: jax.Array,  # [num_slots, num_kv_heads, num_pages, page_size, head_dim]
  kv_slot: jax.Array,  # int32[1]: the slot this layer reads
  block_tables: jax.Array,  # int32[S, pages_per_seq]
  seq_lens: jax.Array,  # int32[S]
  query_start_loc: jax.Array,  # int32[S + 1]
  num_seqs: jax.Array,  # int32[1]
  *,
  sm_scale: float,
  sliding_window: int | None = None,
  soft_cap: float | None = None,
  k_scale: float = 1.0,
  v_scale: float = 1.0,
) -> jax.Array:  # [T, num_q_heads, head_dim], q.dtype
  check_scales(k_pool.dtype, k_scale, v_scale, "ragged_paged_attention")
  num_tokens, num_q_heads, head_dim = q.shape
  _, num_kv_heads, _, page_size, _ = k_pool.shape
  pages_per_seq = block_tables.shape[1]
  group = num_q_heads // num_kv_heads
  max_len = pages_per_seq * page_size

  seq_ids, positions, valid = token_positions(query_start_loc, seq_lens, num_seqs, num_tokens)
  token_pages = block_tables[seq_ids]  # [T, pages_per_seq]
  k = dequantize_kv(gather_pages(k_pool, kv_slot, token_pages), k_scale).reshape(
    num_kv_heads, num_tokens, max_len, head_dim
  )
  v = dequantize_kv(gather_pages(v_pool, kv_slot, token_pages), v_scale).reshape(
    num_kv_heads, num_tokens, max_len, head_dim
  )

  qg = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group, head_dim)
  scores = jnp.einsum("tkgd,ktld->tkgl", qg, k) * sm_scale  # [T, KVH, G, L]
  if soft_cap is not None:
    scores = soft_cap * jnp.tanh(scores / soft_cap)
  kv_pos = jnp.arange(max_len, dtype=jnp.int32)  # [L]
  mask = kv_pos[None, :] <= positions[:, None]  # [T, L]
  if sliding_window is not None:
    mask &= kv_pos[None, :] > positions[:, None] - sliding_window
  scores = jnp.where(mask[:, None, None, :], scores, MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("tkgl,ktld->tkgd", probs, v)
  out = jnp.where(valid[:, None, None, None], out, 0.0)
  return out.reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)


def write_kv_reference(
  k_pool: jax.Array,  # [num_slots, num_kv_heads, num_pages, page_size, head_dim]
  v_pool: jax.Array,  # [num_slots, num_kv_heads, num_pages, page_size, head_dim]
  kv_slot: jax.Array,  # int32[1]: the slot this layer writes
  new_k: jax.Array,  # [T, num_kv_heads, head_dim]
  new_v: jax.Array,  # [T, num_kv_heads, head_dim]
  slot_mapping: jax.Array,  # int32[T]: page_id * page_size + offset; padding tokens -> page 0
  *,
  k_scale: float = 1.0,
  v_scale: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Scatters this step's K/V into their token positions of slot kv_slot (under jit with donated
  pools: in place, the other slots untouched), 8-bit pages getting new_k / k_scale and
  new_v / v_scale quantized (kv_quant.quantize_kv)."""
  check_scales(k_pool.dtype, k_scale, v_scale, "write_kv")
  num_slots, num_kv_heads, num_pages, page_size, head_dim = k_pool.shape
  flat_shape = (num_slots, num_kv_heads, num_pages * page_size, head_dim)

  def scatter(pool: jax.Array, new: jax.Array, scale: float) -> jax.Array:
    flat = pool.reshape(flat_shape).at[kv_slot[0], :, slot_mapping]  # update [T, KVH, D]
    rows = quantize_kv(new, pool.dtype, scale)  # [T, KVH, D]
    return flat.set(rows, mode="drop", unique_indices=False).reshape(pool.shape)

  return scatter(k_pool, new_k, k_scale), scatter(v_pool, new_v, v_scale)
