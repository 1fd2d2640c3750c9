"""Ragged paged attention in plain XLA ops, for backends without a Pallas kernel (the CPU).

The dense reference gathers every token's whole block table (num_tokens * max_model_len K/V
rows). This version walks the block tables a few pages at a time with an online softmax and
stops at the longest live sequence, so a step costs what its contexts hold, not what
max_model_len allows. With a sliding window each token starts its walk at the block holding
the first position it sees (block j of its walk is block first_block[t] + j of its table), so the
loop runs about window / block_len + 1 times whatever the context: work and bytes follow the
window, and pages before it are never read. A block past a token's own last one is all masked
and leaves its softmax state exactly unchanged. Semantics are exactly those of
pallas_kernels/ragged_paged_attention/reference.py, against which it is tested; the pages are
gathered from the stacked pool's slot kv_slot directly (reference.gather_pages), never copied out.

fixed_order (batch_invariant): XLA:CPU computes a dot with its own loops or with Eigen depending
on the operands' total size, so a token's scores round differently with the step's token count;
with fixed_order both contractions are elementwise products summed in a fixed pairwise order
(pallas_kernels/fixed_order.py), the same for every token whatever the batch (more memory: a
[T, KVH, G, L, D] product per block).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.fixed_order import fixed_order_sum
from pallas_kernels.ragged_paged_attention.kv_quant import check_scales, dequantize_kv
from pallas_kernels.ragged_paged_attention.reference import gather_pages, token_positions
from pallas_kernels.ragged_paged_attention.validate import validate_attention_inputs

DEFAULT_PAGES_PER_BLOCK = 8


def ragged_paged_attention_xla(
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
  pages_per_block: int = DEFAULT_PAGES_PER_BLOCK,
  fixed_order: bool = False,
  k_scale: float = 1.0,
  v_scale: float = 1.0,
) -> jax.Array:  # [T, num_q_heads, head_dim], q.dtype
  """8-bit pages (float8_e4m3fn, int8) are read as float32(page) * k_scale (v_scale), block by
  block (kv_quant.py); float pages take scales of 1.0."""
  validate_attention_inputs(
    q,
    k_pool,
    v_pool,
    kv_slot,
    block_tables,
    seq_lens,
    query_start_loc,
    num_seqs,
    sliding_window=sliding_window,
    soft_cap=soft_cap,
  )
  check_scales(k_pool.dtype, k_scale, v_scale, "ragged_paged_attention")
  num_tokens, num_q_heads, head_dim = q.shape
  _, num_kv_heads, _, page_size, _ = k_pool.shape
  group = num_q_heads // num_kv_heads
  pages_per_block = min(pages_per_block, block_tables.shape[1])
  block_len = pages_per_block * page_size

  seq_ids, positions, valid = token_positions(query_start_loc, seq_lens, num_seqs, num_tokens)
  pad = -block_tables.shape[1] % pages_per_block
  token_pages = jnp.pad(block_tables, ((0, 0), (0, pad)))[seq_ids]  # [T, padded pages]
  first_block, num_blocks = _block_range(positions, valid, sliding_window, block_len)
  page_offsets = jnp.arange(pages_per_block, dtype=jnp.int32)  # [ppb]
  last_page = token_pages.shape[1] - 1

  qg = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group, head_dim) * sm_scale
  init = (
    jnp.full((num_tokens, num_kv_heads, group), -jnp.inf, jnp.float32),  # running max
    jnp.zeros((num_tokens, num_kv_heads, group), jnp.float32),  # running sum
    jnp.zeros((num_tokens, num_kv_heads, group, head_dim), jnp.float32),
  )  # accumulator

  def body(step, carry):
    running_max, running_sum, acc = carry
    block = first_block + step  # [T]: each token's block of its table
    page_slots = block[:, None] * pages_per_block + page_offsets[None, :]  # [T, ppb]
    pages = jnp.take_along_axis(token_pages, jnp.minimum(page_slots, last_page), axis=1)
    k = dequantize_kv(gather_pages(k_pool, kv_slot, pages), k_scale).reshape(
      num_kv_heads, num_tokens, block_len, head_dim
    )
    v = dequantize_kv(gather_pages(v_pool, kv_slot, pages), v_scale).reshape(
      num_kv_heads, num_tokens, block_len, head_dim
    )
    scores = _contract(qg, k, "tkgd,ktld->tkgl", fixed_order)  # [T,KVH,G,L]
    if soft_cap is not None:
      scores = soft_cap * jnp.tanh(scores / soft_cap)
    kv_pos = block[:, None] * block_len + jnp.arange(block_len, dtype=jnp.int32)  # [T, L]
    mask = kv_pos <= positions[:, None]
    if sliding_window is not None:
      mask &= kv_pos > positions[:, None] - sliding_window
    mask = mask[:, None, None, :]
    scores = jnp.where(mask, scores, -jnp.inf)
    new_max = jnp.maximum(running_max, scores.max(axis=-1))
    safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
    probs = jnp.where(mask, jnp.exp(scores - safe_max[..., None]), 0.0)
    rescale = jnp.where(jnp.isfinite(running_max), jnp.exp(running_max - safe_max), 0.0)
    running_sum = running_sum * rescale + (
      fixed_order_sum(probs) if fixed_order else probs.sum(axis=-1)
    )
    acc = acc * rescale[..., None] + _contract(probs, v, "tkgl,ktld->tkgd", fixed_order)
    return new_max, running_sum, acc

  _, total, acc = jax.lax.fori_loop(0, num_blocks, body, init)
  out = acc / jnp.where(total > 0, total, 1.0)[..., None]
  out = jnp.where(valid[:, None, None, None], out, 0.0)
  return out.reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)


def _block_range(
  positions: jax.Array, valid: jax.Array, sliding_window: int | None, block_len: int
) -> tuple[jax.Array, jax.Array]:
  """(first_block int32[T]: the block of each token's first visible position, num_blocks: the
  walk's length, the most blocks any live token sees)."""
  if sliding_window is None:
    first_block = jnp.zeros_like(positions)
  else:
    first_block = jnp.maximum(positions - sliding_window + 1, 0) // block_len
  seen = jnp.where(valid, positions // block_len - first_block + 1, 0)  # [T]
  return first_block, jnp.max(seen, initial=0)


def _contract(a: jax.Array, b: jax.Array, spec: str, fixed_order: bool) -> jax.Array:
  """einsum(spec, a, b) for the two contractions above; fixed_order: as elementwise products summed
  by pallas_kernels/fixed_order.py over the contracted axis (d for the scores, l for P @ V)."""
  if not fixed_order:
    return jnp.einsum(spec, a, b)
  b = b.transpose(1, 0, 2, 3)  # [T, KVH, L, D]
  if spec == "tkgd,ktld->tkgl":
    return fixed_order_sum(a[:, :, :, None, :] * b[:, :, None, :, :])  # [T, KVH, G, L]
  return fixed_order_sum(a[:, :, :, None, :] * b.transpose(0, 1, 3, 2)[:, :, None])  # [T,KVH,G,D]
