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
(the production kernel's tiling otherwise). `main` times the production kernel
(pallas_kernels/ragged_paged_attention/gpu), the production kernel on float16 q, and the paired
variant with bfloat16 and float16 MMAs side by side at each batch on fresh random pages, in
bytes of K/V attended a second, each checked against the production output:

  python -m investigations.attention_paired_bytes --batches 512,64 --context 1500
  python -m investigations.attention_paired_bytes --smoke     # tiny, interpret mode, any backend
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxserve.bench.timing import seconds_per_call
from pallas_kernels.ragged_paged_attention.gpu.attention import ragged_paged_attention
from pallas_kernels.ragged_paged_attention.gpu.kernel import (
  LOG2_E,
  _tile_page_ids,
  _zero_padding_block,
)
from pallas_kernels.ragged_paged_attention.gpu.program_map import num_programs, program_map
from pallas_kernels.ragged_paged_attention.gpu.tiling import (
  Tiling,
  choose_tiling,
  has_large_smem,
  num_cores,
)
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


def random_batch(
  num_seqs: int,
  context: int,
  *,
  kv_heads: int,
  q_heads: int,
  head_dim: int,
  page_size: int,
  dtype8,
  seed: int = 0,
):
  """A decode step of num_seqs sequences of `context` cached tokens over shuffled pages."""
  rng = np.random.default_rng(seed)
  pages_per_seq = -(-context // page_size)
  num_pages = num_seqs * pages_per_seq
  tables = rng.permutation(num_pages).reshape(num_seqs, pages_per_seq).astype(np.int32)
  shape = (kv_heads, num_pages, page_size, head_dim)
  k, v = (jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype8) for _ in range(2))
  q = jnp.asarray(rng.standard_normal((num_seqs, q_heads, head_dim), np.float32), jnp.bfloat16)
  seq_lens = jnp.full((num_seqs,), context, jnp.int32)
  qsl = jnp.arange(num_seqs + 1, dtype=jnp.int32)
  return q, k, v, jnp.asarray(tables), seq_lens, qsl, jnp.asarray([num_seqs], jnp.int32)


def compare(num_seqs: int, context: int, args: argparse.Namespace) -> dict:
  """At one batch, side by side: the production kernel (MMAs in q's bfloat16), the production
  kernel on q cast to float16 (its MMAs then in float16: one hardware conversion from e4m3, no
  float16 -> bfloat16 step), and the paired variant with bfloat16 and float16 MMAs. Each
  column's max |difference| from the production output, us, and TB/s of K/V attended."""
  dtype8 = jnp.dtype(args.pages)
  q, k, v, tables, seq_lens, qsl, n = random_batch(
    num_seqs,
    context,
    kv_heads=args.kv_heads,
    q_heads=args.q_heads,
    head_dim=args.head_dim,
    page_size=args.page_size,
    dtype8=dtype8,
  )
  interpret = jax.default_backend() != "gpu"
  tiling = choose_tiling(
    num_seqs,
    num_seqs,
    args.q_heads,
    args.kv_heads,
    args.head_dim,
    max_kv_len=context,
    page_itemsize=1,
    num_cores=num_cores(),
    large_smem=has_large_smem(),
    num_kv_splits=1,
  )
  sm_scale = args.head_dim**-0.5
  production = jax.jit(
    functools.partial(
      ragged_paged_attention,
      sm_scale=sm_scale,
      block_q=tiling.block_q,
      block_kv=tiling.block_kv,
      num_warps=tiling.num_warps,
      num_stages=tiling.num_stages,
      num_kv_splits=1,
      interpret=interpret,
    )
  )
  pairs = (as_pairs(k), as_pairs(v))
  columns = {
    "production": (production, q, (k, v)),
    "production_f16": (production, q.astype(jnp.float16), (k, v)),
  }
  for mma in ("bfloat16", "float16"):
    fn = functools.partial(
      paired_attention,
      tiling=tiling,
      dtype8=dtype8,
      mma_dtype=jnp.dtype(mma),
      sm_scale=sm_scale,
      interpret=interpret,
    )
    columns["paired" if mma == "bfloat16" else "paired_f16"] = (fn, q, pairs)
  kv_bytes = 2 * num_seqs * context * args.kv_heads * args.head_dim
  row: dict = {"num_seqs": num_seqs, "context": context, "pages": str(dtype8)}
  want = production(q, k, v, tables, seq_lens, qsl, n).astype(jnp.float32)
  for name, (fn, q_in, pages) in columns.items():
    got = fn(q_in, *pages, tables, seq_lens, qsl, n).astype(jnp.float32)
    s = seconds_per_call(
      fn, q_in, *pages, tables, seq_lens, qsl, n, inner=args.inner, reps=args.reps
    )
    row[name] = {
      "us": 1e6 * s,
      "tb_per_s": kv_bytes / s / 1e12,
      "max_abs_diff": float(jnp.max(jnp.abs(got - want))),
    }
    print(
      f"{num_seqs} x {context} {dtype8} {name}: {1e6 * s:.1f} us, "
      f"{kv_bytes / s / 1e12:.2f} TB/s, max |diff| {row[name]['max_abs_diff']:.2e}",
      flush=True,
    )
  return row


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batches", default="512,64")
  parser.add_argument("--context", type=int, default=1500)
  parser.add_argument("--pages", choices=("float8_e4m3fn", "int8"), default="float8_e4m3fn")
  parser.add_argument("--kv-heads", type=int, default=8)
  parser.add_argument("--q-heads", type=int, default=32)
  parser.add_argument("--head-dim", type=int, default=128)
  parser.add_argument("--page-size", type=int, default=16)
  parser.add_argument("--inner", type=int, default=10)
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--smoke", action="store_true", help="tiny shapes, interpret mode")
  parser.add_argument("--out")
  args = parser.parse_args(argv)
  if args.smoke:
    args.batches, args.context, args.kv_heads, args.q_heads = "3", 40, 2, 4
    args.head_dim, args.inner, args.reps = 64, 1, 1
  rows = [compare(int(b), args.context, args) for b in args.batches.split(",")]
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"device": jax.devices()[0].device_kind, "rows": rows}, f)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
