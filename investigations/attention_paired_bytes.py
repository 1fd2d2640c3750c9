"""An experiment on the GPU attention kernel's 8-bit pages: read them as pairs of bytes.

Compiled by Triton for sm_90 (`investigations/triton_static.py --pages float8_e4m3fn`), the
kernel's 8-bit K tile reaches its MMA through 128 one-byte shared-memory loads a thread a tile
(`ld.shared.b8`) after 8-byte asynchronous copies, where bfloat16 pages take `ldmatrix` and
16-byte copies: Triton lays an 8-bit operand that is converted and transposed into a bfloat16
MMA out byte by byte. This variant reads the same pages as uint16 pairs [.., D / 2] (the bytes of
dims 2j and 2j + 1, a free bitcast of the page array), splits each pair into its two 8-bit
values in registers and runs the head dimension as two halves: logits = q_even . k_even +
q_odd . k_odd (a dot product does not care how its terms are ordered), and the output's even and
odd dims as two accumulators stored interleaved at the end. Each tile then moves through shared
memory as 16-bit data.

A second lever, in both kernels: fp8 pages convert to bfloat16 as e4m3 -> float16 pairs (one
instruction) and then float16 -> bfloat16 one value at a time (two more); with the MMAs in
float16 (q cast to float16, clipped to its range) the second step goes.

Scope: a decode-or-prefill batch with causal masking, no sliding window or soft cap, one KV split
(the production kernel's tiling otherwise). investigations/bench_paired_bytes.py times it beside
the production kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.ragged_paged_attention.gpu.kernel import (
  LOG2_E,
  _tile_page_ids,
  _zero_padding_block,
)
from pallas_kernels.ragged_paged_attention.gpu.program_map import num_programs, program_map
from pallas_kernels.ragged_paged_attention.gpu.tiling import Tiling
from pallas_kernels.ragged_paged_attention.reference import MASK_VALUE
from pallas_kernels.triton_params import triton_compiler_params


def as_pairs(pages: jax.Array) -> jax.Array:
  """8-bit pages [..., D] -> uint16 [..., D / 2]: element j holds dims 2j (low byte), 2j + 1."""
  paired = pages.reshape(*pages.shape[:-1], pages.shape[-1] // 2, 2)  # [..., D / 2, 2]
  return lax.bitcast_convert_type(lax.bitcast_convert_type(paired, jnp.uint8), jnp.uint16)


def _unpack(pairs: jax.Array, dtype8, out_dtype) -> tuple[jax.Array, jax.Array]:
  """uint16 [R, C] -> (even dims, odd dims) [R, C] each in out_dtype."""
  low = (pairs & 0xFF).astype(jnp.uint8)
  high = (pairs >> 8).astype(jnp.uint8)
  return tuple(lax.bitcast_convert_type(b, dtype8).astype(out_dtype) for b in (low, high))


def _kernel(
  program_seqs_ref,
  program_blocks_ref,
  query_start_loc_ref,
  seq_lens_ref,
  num_seqs_ref,
  block_tables_ref,
  q_ref,  # [T, Gp, D]
  k_ref,  # uint16 [num_pages, page_size, D / 2]
  v_ref,
  out_ref,  # [T, Gp, D]
  *,
  tiling: Tiling,
  dtype8,
  mma_dtype,
  sm_scale: float,
  v_scale: float,
):
  seq = program_seqs_ref[pl.program_id(0)]
  block = program_blocks_ref[pl.program_id(0)]

  @pl.when(seq < 0)
  def _():
    _zero_padding_block(out_ref, query_start_loc_ref[num_seqs_ref[0]], block, tiling)

  @pl.when(seq >= 0)
  def _():
    _attend(
      block_tables_ref,
      query_start_loc_ref,
      seq_lens_ref,
      q_ref,
      k_ref,
      v_ref,
      out_ref,
      seq=seq,
      block=block,
      tiling=tiling,
      dtype8=dtype8,
      mma_dtype=mma_dtype,
      sm_scale=sm_scale,
      v_scale=v_scale,
    )


def _attend(
  block_tables_ref,
  qsl_ref,
  seq_lens_ref,
  q_ref,
  k_ref,
  v_ref,
  out_ref,
  *,
  seq,
  block,
  tiling: Tiling,
  dtype8,
  mma_dtype,
  sm_scale: float,
  v_scale: float,
):
  num_tokens, _, head_dim = q_ref.shape
  half = head_dim // 2
  q_start = qsl_ref[seq]
  q_len = qsl_ref[seq + 1] - q_start
  seq_len = seq_lens_ref[seq]
  first_q = block * tiling.block_q
  rows = jnp.arange(tiling.rows, dtype=jnp.int32)  # [M]
  row_q = first_q + rows // tiling.padded_group  # [M]
  row_heads = rows % tiling.padded_group  # [M]
  row_valid = (row_q < q_len) & (row_heads < tiling.group)  # [M]
  row_tokens = jnp.where(row_valid, q_start + row_q, num_tokens)  # [M]
  row_pos = seq_len - q_len + row_q  # [M]
  half_dims = jnp.arange(half, dtype=jnp.int32)[None, :]  # [1, D / 2]
  pair_dims = 2 * half_dims  # [1, D / 2]
  mask = jnp.broadcast_to(row_valid[:, None], (tiling.rows, half))
  q_even, q_odd = (
    plgpu.load(
      q_ref.at[row_tokens[:, None], row_heads[:, None], pair_dims + parity], mask=mask, other=0
    )
    for parity in (0, 1)
  )  # [M, D / 2] each
  if mma_dtype == jnp.float16:  # float16's range: q past it would be inf
    q_even, q_odd = (jnp.clip(x.astype(jnp.float32), -65504.0, 65504.0) for x in (q_even, q_odd))
  q_even, q_odd = q_even.astype(mma_dtype), q_odd.astype(mma_dtype)
  last_q = jnp.minimum(first_q + tiling.block_q, q_len) - 1
  tile_end = pl.cdiv(seq_len - q_len + last_q + 1, tiling.block_kv)
  page_size = k_ref.shape[1]
  zeros = jnp.zeros((tiling.rows, half), jnp.float32)
  carry = (
    zeros,
    zeros,
    jnp.full((tiling.rows,), MASK_VALUE, jnp.float32),
    jnp.zeros((tiling.rows,), jnp.float32),
    _tile_page_ids(block_tables_ref, seq, seq_len, 0, tiling, page_size),
  )

  def tile_fn(tile, carry):
    acc_even, acc_odd, row_max, row_sum, page_ids = carry
    kv_pos = tile * tiling.block_kv + jnp.arange(tiling.block_kv, dtype=jnp.int32)  # [BK]
    next_ids = _tile_page_ids(block_tables_ref, seq, seq_len, tile + 1, tiling, page_size)
    index = (page_ids[:, None], (kv_pos % page_size)[:, None], half_dims)
    kv_mask = jnp.broadcast_to((kv_pos < seq_len)[:, None], (tiling.block_kv, half))
    k_pairs, v_pairs = (
      plgpu.load(ref.at[index], mask=kv_mask, other=jnp.zeros((), jnp.uint16))
      for ref in (k_ref, v_ref)
    )  # uint16 [BK, D / 2] each
    k_even, k_odd = _unpack(k_pairs, dtype8, q_even.dtype)  # [BK, D / 2] each
    dims = (((1,), (1,)), ((), ()))
    logits = (
      lax.dot_general(q_even, k_even, dims, preferred_element_type=jnp.float32)
      + lax.dot_general(q_odd, k_odd, dims, preferred_element_type=jnp.float32)
    ) * sm_scale  # [M, BK]
    logits = jnp.where(kv_pos[None, :] <= row_pos[:, None], logits, MASK_VALUE)
    new_max = jnp.maximum(row_max, jnp.max(logits, axis=1))  # [M]
    correction = jnp.exp2((row_max - new_max) * LOG2_E)  # [M]
    probs = jnp.exp2((logits - new_max[:, None]) * LOG2_E)  # [M, BK]
    row_sum = row_sum * correction + jnp.sum(probs, axis=1)
    v_even, v_odd = _unpack(v_pairs, dtype8, q_even.dtype)  # [BK, D / 2] each
    probs = probs.astype(q_even.dtype)
    pv = (((1,), (0,)), ((), ()))
    acc_even = acc_even * correction[:, None] + lax.dot_general(
      probs, v_even, pv, preferred_element_type=jnp.float32
    )
    acc_odd = acc_odd * correction[:, None] + lax.dot_general(
      probs, v_odd, pv, preferred_element_type=jnp.float32
    )
    return acc_even, acc_odd, new_max, row_sum, next_ids

  acc_even, acc_odd, _, row_sum, _ = lax.fori_loop(0, tile_end, tile_fn, carry)
  norm = v_scale / jnp.where(row_valid, row_sum, 1.0)[:, None]  # [M, 1]
  for parity, acc in ((0, acc_even), (1, acc_odd)):
    index = (row_tokens[:, None], row_heads[:, None], pair_dims + parity)
    plgpu.store(out_ref.at[index], (acc * norm).astype(out_ref.dtype), mask=mask)


@functools.partial(
  jax.jit, static_argnames=("tiling", "dtype8", "mma_dtype", "sm_scale", "v_scale", "interpret")
)
def paired_attention(
  q,
  k_pairs,
  v_pairs,
  block_tables,
  seq_lens,
  query_start_loc,
  num_seqs,
  *,
  tiling: Tiling,
  dtype8,
  mma_dtype=jnp.bfloat16,
  sm_scale: float,
  v_scale: float = 1.0,
  interpret: bool = False,
):
  """q [T, QH, D]; k_pairs / v_pairs uint16 [KV, P, page_size, D / 2] (`as_pairs` of 8-bit pages
  of dtype8); block_tables int32[S, pages]; seq_lens int32[S]; query_start_loc int32[S + 1];
  num_seqs int32[1] -> [T, QH, D] in q's dtype, as the production kernel computes it."""
  num_tokens, num_q_heads, head_dim = q.shape
  num_kv_heads, num_pages, page_size, half = k_pairs.shape
  if k_pairs.dtype != jnp.uint16 or 2 * half != head_dim or tiling.num_kv_splits != 1:
    raise ValueError("paired_attention: uint16 pairs of D / 2, one KV split")
  group, padded = tiling.group, tiling.padded_group
  q_grouped = q.reshape(num_tokens, num_kv_heads, group, head_dim)
  q_grouped = jnp.pad(q_grouped, ((0, 0), (0, 0), (0, padded - group), (0, 0)))
  rows_spec = pl.BlockSpec((num_tokens, None, padded, head_dim), lambda b, h: (0, h, 0, 0))
  pages_spec = pl.BlockSpec((None, num_pages, page_size, half), lambda b, h: (h, 0, 0, 0))
  programs = num_programs(num_tokens, block_tables.shape[0], tiling.block_q)
  seqs, blocks = program_map(query_start_loc, num_seqs, programs, tiling.block_q)
  kernel = functools.partial(
    _kernel,
    tiling=tiling,
    dtype8=dtype8,
    mma_dtype=jnp.dtype(mma_dtype),
    sm_scale=sm_scale,
    v_scale=v_scale,
  )
  out = pl.pallas_call(
    kernel,
    grid=(programs, num_kv_heads),
    in_specs=[pl.no_block_spec] * 6 + [rows_spec, pages_spec, pages_spec],
    out_specs=rows_spec,
    out_shape=jax.ShapeDtypeStruct((num_tokens, num_kv_heads, padded, head_dim), q.dtype),
    compiler_params=triton_compiler_params(tiling.num_warps, tiling.num_stages),
    interpret=interpret,
    name="ragged_paged_attention_paired",
  )(seqs, blocks, query_start_loc, seq_lens, num_seqs, block_tables, q_grouped, k_pairs, v_pairs)
  return out[:, :, :group].reshape(q.shape)
