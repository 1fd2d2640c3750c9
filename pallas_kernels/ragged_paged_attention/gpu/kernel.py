"""The GPU ragged paged attention kernel's body (Pallas Triton): what one program (b, h[, p])
computes. gpu.py launches it (grid, block specs, the split merge) and validates its inputs; the
design (programs, tiles, online softmax, split KV) is described there.

The refs and their shapes: program_seqs / program_blocks int32[G] (program_map.py),
query_start_loc int32[S + 1], seq_lens int32[S], num_seqs int32[1], kv_slot int32[1],
block_tables int32[S, pages_per_seq], q [T, Gp, D] (the kv head's padded group of q heads, Gp =
tiling.padded_group), k / v [num_slots, num_pages, page_size, D] (the kv head's pages of every
slot of the stacked pool: the gathers index slot kv_slot[0], a dynamic leading index); outputs
(out [T, Gp, D],) or, split, (acc [T, Gp, D], max [T, Gp], sum [T, Gp]) in float32.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.ragged_paged_attention.gpu.tiling import Tiling
from pallas_kernels.ragged_paged_attention.kv_quant import is_quantized
from pallas_kernels.ragged_paged_attention.reference import MASK_VALUE

LOG2_E = math.log2(math.e)


def attention_kernel(
  program_seqs_ref,
  program_blocks_ref,
  query_start_loc_ref,
  seq_lens_ref,
  num_seqs_ref,
  kv_slot_ref,
  block_tables_ref,
  q_ref,
  k_ref,
  v_ref,
  *out_refs,
  tiling: Tiling,
  sm_scale: float,
  v_scale: float,
  sliding_window: int | None,
  soft_cap: float | None,
):
  """out_refs: (out [T, Gp, D],) or, split, (acc [T, Gp, D], max [T, Gp], sum [T, Gp])."""
  program = pl.program_id(0)
  kv_split = pl.program_id(2)  # read here: program_id inside pl.when does not interpret
  seq = program_seqs_ref[program]
  block = program_blocks_ref[program]
  if tiling.num_kv_splits == 1:  # split outputs are merged (and padding zeroed) afterwards

    @pl.when(seq < 0)
    def _():
      _zero_padding_block(out_refs[0], query_start_loc_ref[num_seqs_ref[0]], block, tiling)

  live_seq = jnp.maximum(seq, 0)
  q_start = query_start_loc_ref[live_seq]
  kv_slot = kv_slot_ref[0]

  @pl.when(seq >= 0)
  def _():
    _attend_query_block(
      block_tables_ref,
      q_ref,
      k_ref,
      v_ref,
      out_refs,
      kv_slot=kv_slot,
      seq=live_seq,
      q_start=q_start,
      q_len=query_start_loc_ref[live_seq + 1] - q_start,
      first_q=block * tiling.block_q,
      seq_len=seq_lens_ref[live_seq],
      kv_split=kv_split,
      tiling=tiling,
      sm_scale=sm_scale,
      v_scale=v_scale,
      sliding_window=sliding_window,
      soft_cap=soft_cap,
    )


def _zero_padding_block(out_ref, num_live, token_block, tiling: Tiling):
  """Zeros the rows of padding tokens (index >= num_live) in query block token_block."""
  num_tokens, _, head_dim = out_ref.shape
  rows = jnp.arange(tiling.rows, dtype=jnp.int32)  # [M]
  row_tokens = token_block * tiling.block_q + rows // tiling.padded_group  # [M]
  row_valid = (row_tokens >= num_live) & (row_tokens < num_tokens)  # [M]
  row_tokens = jnp.where(row_valid, row_tokens, num_tokens)  # [M], OOB when invalid
  dims = jnp.arange(head_dim, dtype=jnp.int32)[None, :]  # [1, D]
  index = (row_tokens[:, None], (rows % tiling.padded_group)[:, None], dims)
  mask = jnp.broadcast_to(row_valid[:, None], (tiling.rows, head_dim))
  plgpu.store(out_ref.at[index], jnp.zeros((tiling.rows, head_dim), out_ref.dtype), mask=mask)


def _attend_query_block(
  block_tables_ref,
  q_ref,
  k_ref,
  v_ref,
  out_refs,
  *,
  kv_slot,
  seq,
  q_start,
  q_len,
  first_q,
  seq_len,
  kv_split,
  tiling: Tiling,
  sm_scale: float,
  v_scale: float,
  sliding_window: int | None,
  soft_cap: float | None,
):
  num_tokens = q_ref.shape[0]
  head_dim = q_ref.shape[-1]
  rows = jnp.arange(tiling.rows, dtype=jnp.int32)  # [M]
  row_q = first_q + rows // tiling.padded_group  # [M] query index in seq
  row_heads = rows % tiling.padded_group  # [M]
  row_valid = (row_q < q_len) & (row_heads < tiling.group)  # [M]
  row_tokens = jnp.where(row_valid, q_start + row_q, num_tokens)  # [M], OOB when invalid
  row_pos = seq_len - q_len + row_q  # [M] cache position
  dims = jnp.arange(head_dim, dtype=jnp.int32)[None, :]  # [1, D]
  row_mask = jnp.broadcast_to(row_valid[:, None], (tiling.rows, head_dim))
  q = plgpu.load(
    q_ref.at[row_tokens[:, None], row_heads[:, None], dims], mask=row_mask, other=0
  )  # [M, D]

  last_q = jnp.minimum(first_q + tiling.block_q, q_len) - 1
  kv_stop = seq_len - q_len + last_q + 1
  kv_begin = 0
  if sliding_window is not None:
    kv_begin = jnp.maximum(seq_len - q_len + first_q - sliding_window + 1, 0)
  tile_begin = kv_begin // tiling.block_kv
  tile_end = pl.cdiv(kv_stop, tiling.block_kv)
  if tiling.num_kv_splits > 1:
    tiles_per_split = pl.cdiv(tile_end - tile_begin, tiling.num_kv_splits)
    tile_begin = tile_begin + kv_split * tiles_per_split
    tile_end = jnp.minimum(tile_end, tile_begin + tiles_per_split)

  tile_fn = functools.partial(
    _attend_kv_tile,
    block_tables_ref,
    k_ref,
    v_ref,
    q,
    row_pos,
    kv_slot=kv_slot,
    seq=seq,
    seq_len=seq_len,
    tiling=tiling,
    sm_scale=sm_scale,
    sliding_window=sliding_window,
    soft_cap=soft_cap,
  )
  acc = jnp.zeros((tiling.rows, head_dim), jnp.float32)  # [M, D]
  row_max = jnp.full((tiling.rows,), MASK_VALUE, jnp.float32)  # [M]
  row_sum = jnp.zeros((tiling.rows,), jnp.float32)  # [M]
  # Each iteration loads the next tile's page ids and carries them: the K/V copies' addresses
  # then come from the loop's carry, not from a load in the same iteration, and Triton's
  # pipeliner gives the K/V copies num_stages - 1 shared-memory buffers instead of one.
  page_ids = _tile_page_ids(block_tables_ref, seq, seq_len, tile_begin, tiling, k_ref.shape[2])
  acc, row_max, row_sum, _ = lax.fori_loop(
    tile_begin, tile_end, tile_fn, (acc, row_max, row_sum, page_ids)
  )
  if v_scale != 1.0:  # 8-bit V pages hold V / v_scale
    acc = acc * v_scale

  row_index = (row_tokens[:, None], row_heads[:, None], dims)
  if tiling.num_kv_splits == 1:
    (out_ref,) = out_refs
    out = acc / jnp.where(row_valid, row_sum, 1.0)[:, None]  # [M, D]
    plgpu.store(out_ref.at[row_index], out.astype(out_ref.dtype), mask=row_mask)
    return
  acc_ref, max_ref, sum_ref = out_refs
  plgpu.store(acc_ref.at[row_index], acc, mask=row_mask)
  plgpu.store(max_ref.at[row_tokens, row_heads], row_max, mask=row_valid)
  plgpu.store(sum_ref.at[row_tokens, row_heads], row_sum, mask=row_valid)


def _attend_kv_tile(
  block_tables_ref,
  k_ref,
  v_ref,
  q,
  row_pos,
  tile,
  carry,
  *,
  kv_slot,
  seq,
  seq_len,
  tiling: Tiling,
  sm_scale: float,
  sliding_window: int | None,
  soft_cap: float | None,
):
  acc, row_max, row_sum, page_ids = carry
  _, _, page_size, head_dim = k_ref.shape
  kv_pos = tile * tiling.block_kv + jnp.arange(tiling.block_kv, dtype=jnp.int32)  # [BK]
  kv_valid = kv_pos < seq_len  # [BK]
  next_page_ids = _tile_page_ids(block_tables_ref, seq, seq_len, tile + 1, tiling, page_size)
  offsets = kv_pos % page_size  # [BK]
  dims = jnp.arange(head_dim, dtype=jnp.int32)[None, :]  # [1, D]
  kv_mask = jnp.broadcast_to(kv_valid[:, None], (tiling.block_kv, head_dim))
  kv_index = (kv_slot, page_ids[:, None], offsets[:, None], dims)
  # Masked rows read as 0 through the load's own fill, typed as the pages (a Python 0 does not
  # cast to an 8-bit float): 8-bit tiles then go from shared memory straight into the MMA
  # operands' registers and are converted there, where a select after the load would need the
  # mask in the operands' layout and round-trip every converted tile through shared memory.
  k, v = (
    plgpu.load(ref.at[kv_index], mask=kv_mask, other=jnp.zeros((), ref.dtype))
    for ref in (k_ref, v_ref)
  )  # [BK, D] each, the pages' dtype
  if is_quantized(k_ref.dtype):  # 8-bit pages: the MMAs run in q's dtype, scales applied outside
    k, v = k.astype(q.dtype), v.astype(q.dtype)  # [BK, D] each

  precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
  logits = (
    lax.dot_general(
      q, k, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
    )
    * sm_scale
  )  # [M, BK]
  if soft_cap is not None:
    logits = soft_cap * jnp.tanh(logits / soft_cap)
  visible = kv_pos[None, :] <= row_pos[:, None]  # [M, BK]
  if sliding_window is not None:
    visible &= kv_pos[None, :] > row_pos[:, None] - sliding_window
  logits = jnp.where(visible, logits, MASK_VALUE)

  new_max = jnp.maximum(row_max, jnp.max(logits, axis=1))  # [M]
  correction = jnp.exp2((row_max - new_max) * LOG2_E)  # [M]
  probs = jnp.exp2((logits - new_max[:, None]) * LOG2_E)  # [M, BK]
  row_sum = row_sum * correction + jnp.sum(probs, axis=1)
  pv = lax.dot_general(
    probs.astype(v.dtype),
    v,
    (((1,), (0,)), ((), ())),
    precision=precision,
    preferred_element_type=jnp.float32,
  )  # [M, D]
  return acc * correction[:, None] + pv, new_max, row_sum, next_page_ids


def _tile_page_ids(block_tables_ref, seq, seq_len, tile, tiling: Tiling, page_size: int):
  """int32[BK]: the page of each KV token of tile `tile` (0 past the sequence)."""
  pages_per_seq = block_tables_ref.shape[1]
  kv_pos = tile * tiling.block_kv + jnp.arange(tiling.block_kv, dtype=jnp.int32)  # [BK]
  page_slots = kv_pos // page_size  # [BK]
  valid = (kv_pos < seq_len) & (page_slots < pages_per_seq)
  return plgpu.load(block_tables_ref.at[seq, page_slots], mask=valid, other=0)  # [BK]
