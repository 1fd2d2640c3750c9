"""Ragged paged attention for GPUs: one Pallas (Triton) kernel for mixed prefill + decode batches.

Grid: (G, num_kv_heads) with G = cdiv(T + S * (block_q - 1), block_q) + 1 (`num_programs`).
Program (b, h) owns `block_q` consecutive query tokens of one sequence and all q heads that share
kv head h: its rows are the block_q * padded_group (token, q head) pairs, so each K/V page of a
sequence is read once per kv head and query block, and decode rows of a GQA group fill one
tensor-core tile together. The live sequences' query blocks are numbered one after the other;
`program_map` (program_map.py: a few small XLA ops, the same for every layer) gives each
program its sequence and block, so a program reads two scalars instead of searching for its
sequence, and no program idles on a gap in the numbering. A program walks its sequence's KV in
tiles of `block_kv` tokens: each token's page id comes from the block table, K/V rows are gathered
straight from the pages (no contiguous copy), and an online softmax (flash attention, float32
running max / sum / accumulator) folds the tile in. Causality inside a prefill chunk, the
sliding window and the logit soft-cap are applied to each tile's logits; tiles entirely outside
the window or past the last query are never loaded. Padding tokens produce zeros: the programs
numbered past the live sequences' blocks (there are always enough) each zero one block of
padding rows, so the output needs no separate zero-fill.

Split KV (flash decoding): with num_kv_splits = P > 1 the grid gains a third axis and program
(b, h, p) folds only the p-th of P equal runs of the block's KV tiles, storing its unnormalized
float32 accumulator, running max and running sum; a small XLA epilogue merges the P partial
states. The default turns it on only for decode-only shapes (T <= S) with fewer than two
programs per streaming multiprocessor, e.g. batch 8 x 8 kv heads on an H100.

Defaults (`choose_tiling`, tiling.py): each class of shape's measured tile sizes are a row of
tiling_table.json: decode-only shapes (T <= S) take fewer query rows a program and, on Hopper,
longer KV tiles; 8-bit pages take a pipeline stage more (two K/V tiles in flight a program: the
loop prefetches the next tile's page ids). block_q is the row's query rows over
next_pow2(group), at least 1.

The stacked pool: k_pool / v_pool [num_slots, num_kv_heads, num_pages, page_size, head_dim] hold
every layer's pages; the BlockSpec hands program (b, h) kv head h of every slot, and the page
gathers take the layer's slot kv_slot[0] as their leading index (Triton has no scalar prefetch:
kv_slot is a one-element int32 input read in the kernel). The offsets are those of the whole
stacked array (addressing.py).

The kernel's body is kernel.py; this module launches it and validates its inputs.

Triton rather than Mosaic GPU: the Triton lowering runs on Ampere and Hopper and takes
per-element pointer gathers (the per-token page lookup), masked loads and data-dependent loop
bounds directly (docs/DECISIONS.md, "Triton, not Mosaic GPU, for the GPU attention kernel").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.ragged_paged_attention.gpu.kernel import attention_kernel
from pallas_kernels.ragged_paged_attention.gpu.program_map import num_programs, program_map
from pallas_kernels.ragged_paged_attention.gpu.tiling import (
  Tiling,
  choose_tiling,
  has_large_smem,
  num_cores,
)
from pallas_kernels.ragged_paged_attention.gpu.write import write_kv
from pallas_kernels.ragged_paged_attention.kv_quant import check_scales
from pallas_kernels.ragged_paged_attention.validate import (
  SUPPORTED_HEAD_DIMS,
  validate_attention_inputs,
)
from pallas_kernels.triton_params import triton_compiler_params

__all__ = ["ragged_paged_attention", "write_kv", "Tiling", "choose_tiling"]

SUPPORTED_PAGE_SIZES = (16, 32, 64)


def _combine_splits(acc, row_max, row_sum, query_start_loc, num_seqs):
  """Merges per-split partial softmax states: acc [P, T, KVH, G, D], row_max / row_sum
  [P, T, KVH, G]."""
  global_max = jnp.max(row_max, axis=0)  # [T, KVH, G]
  weights = jnp.exp(row_max - global_max[None])  # [P, T, KVH, G]
  numerator = jnp.sum(acc * weights[..., None], axis=0)  # [T, KVH, G, D]
  denominator = jnp.sum(row_sum * weights, axis=0)  # [T, KVH, G]
  out = numerator / jnp.where(denominator > 0, denominator, 1.0)[..., None]
  live = jnp.arange(acc.shape[1]) < query_start_loc[num_seqs[0]]  # [T]
  return jnp.where(live[:, None, None, None], out, 0.0)


@functools.partial(
  jax.jit,
  static_argnames=("tiling", "sm_scale", "v_scale", "sliding_window", "soft_cap", "interpret"),
)
def _ragged_paged_attention(
  q,
  k_pool,
  v_pool,
  kv_slot,
  block_tables,
  seq_lens,
  query_start_loc,
  num_seqs,
  *,
  tiling: Tiling,
  sm_scale: float,
  v_scale: float,
  sliding_window: int | None,
  soft_cap: float | None,
  interpret: bool,
):
  num_tokens, num_q_heads, head_dim = q.shape
  num_slots, num_kv_heads, num_pages, page_size, _ = k_pool.shape
  num_seq_slots = block_tables.shape[0]
  num_splits = tiling.num_kv_splits
  group, padded_group = tiling.group, tiling.padded_group
  grouped_shape = (num_tokens, num_kv_heads, padded_group, head_dim)
  q_grouped = q.reshape(num_tokens, num_kv_heads, group, head_dim)
  if padded_group != group:
    q_grouped = jnp.pad(q_grouped, ((0, 0), (0, 0), (0, padded_group - group), (0, 0)))
  rows_spec = pl.BlockSpec((num_tokens, None, padded_group, head_dim), lambda b, h, s: (0, h, 0, 0))
  pages_spec = pl.BlockSpec(
    (num_slots, None, num_pages, page_size, head_dim), lambda b, h, s: (0, h, 0, 0, 0)
  )  # [num_slots, num_pages, page_size, D]: kv head h of every slot
  kernel = functools.partial(
    attention_kernel,
    tiling=tiling,
    sm_scale=sm_scale,
    v_scale=v_scale,
    sliding_window=sliding_window,
    soft_cap=soft_cap,
  )
  grid_programs = num_programs(num_tokens, num_seq_slots, tiling.block_q)
  program_seqs, program_blocks = program_map(
    query_start_loc, num_seqs, grid_programs, tiling.block_q
  )
  inputs = [
    program_seqs,
    program_blocks,
    query_start_loc,
    seq_lens,
    num_seqs,
    kv_slot,
    block_tables,
    q_grouped,
    k_pool,
    v_pool,
  ]
  in_specs = [pl.no_block_spec] * 7 + [rows_spec, pages_spec, pages_spec]
  if num_splits == 1:
    out_specs = rows_spec
    out_shape = jax.ShapeDtypeStruct(grouped_shape, q.dtype)
  else:
    out_specs = [
      pl.BlockSpec(
        (None, num_tokens, None, padded_group, head_dim), lambda b, h, s: (s, 0, h, 0, 0)
      )
    ] + 2 * [pl.BlockSpec((None, num_tokens, None, padded_group), lambda b, h, s: (s, 0, h, 0))]
    out_shape = [jax.ShapeDtypeStruct((num_splits, *grouped_shape), jnp.float32)] + 2 * [
      jax.ShapeDtypeStruct((num_splits, *grouped_shape[:-1]), jnp.float32)
    ]
  outs = pl.pallas_call(
    kernel,
    grid=(grid_programs, num_kv_heads, num_splits),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    compiler_params=triton_compiler_params(tiling.num_warps, tiling.num_stages),
    interpret=interpret,
    name="ragged_paged_attention",
  )(*inputs)
  if num_splits == 1:
    return outs[:, :, :group].reshape(q.shape)
  acc, row_max, row_sum = (x[:, :, :, :group] for x in outs)
  out = _combine_splits(acc, row_max, row_sum, query_start_loc, num_seqs)
  return out.astype(q.dtype).reshape(q.shape)


def ragged_paged_attention(
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
  block_q: int | None = None,
  block_kv: int | None = None,
  num_warps: int | None = None,
  num_stages: int | None = None,
  num_kv_splits: int | None = None,
  k_scale: float = 1.0,
  v_scale: float = 1.0,
  interpret: bool = False,
) -> jax.Array:  # [T, num_q_heads, head_dim], q.dtype
  """Attention of a ragged batch of query tokens over a paged KV cache (GPU, Pallas Triton).

  Same semantics as `ragged_paged_attention_reference` (see reference.py): q [T, num_q_heads,
  head_dim]; k_pool/v_pool [num_slots, num_kv_heads, num_pages, page_size, head_dim] (the stacked
  pool) with head_dim in (64, 128, 256) and page_size in (16, 32, 64); kv_slot int32[1], the slot
  read (in [0, num_slots), not checked on the device); block_tables int32[S, pages_per_seq];
  seq_lens int32[S] (cache length after this step's write); query_start_loc int32[S + 1];
  num_seqs int32[1]. Returns [T, num_q_heads, head_dim] in q.dtype; padding tokens get zeros.
  The pools may be 8-bit (float8_e4m3fn or int8: K / k_scale and V / v_scale, kv_quant.py):
  each tile is loaded 8-bit and cast to q's dtype for the MMAs, k_scale is folded into sm_scale
  and v_scale multiplies the output (float pages take scales of 1.0).

  Tile keywords (None picks `choose_tiling`'s defaults): block_q query tokens per program
  (power of two; block_q * next_pow2(num_q_heads // num_kv_heads) rows must lie in [16, 128]),
  block_kv KV tokens per loop step (power of two >= 16), num_warps, num_stages, and
  num_kv_splits: each (query block, kv head) splits its KV tiles over this many programs whose
  partial softmax states are merged afterwards (flash decoding; for small decode batches).
  `interpret=True` runs the same kernel in the Pallas interpreter (works on CPU).
  Raises ValueError on bad shapes, dtypes, head_dim, page_size or block sizes.
  """
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
    head_dims=SUPPORTED_HEAD_DIMS,
  )
  check_scales(k_pool.dtype, k_scale, v_scale, "ragged_paged_attention")
  page_size = k_pool.shape[3]
  if page_size not in SUPPORTED_PAGE_SIZES:
    raise ValueError(
      f"ragged_paged_attention: k_pool: page_size {page_size} not supported "
      f"(supported: {SUPPORTED_PAGE_SIZES})"
    )
  num_tokens, num_q_heads, head_dim = q.shape
  tiling = choose_tiling(
    num_tokens,
    block_tables.shape[0],
    num_q_heads,
    k_pool.shape[1],
    head_dim,
    max_kv_len=block_tables.shape[1] * page_size,
    page_itemsize=k_pool.dtype.itemsize,
    num_cores=num_cores(),
    large_smem=has_large_smem(),
    block_q=block_q,
    block_kv=block_kv,
    num_warps=num_warps,
    num_stages=num_stages,
    num_kv_splits=num_kv_splits,
  )
  if num_tokens == 0:
    return jnp.zeros_like(q)
  return _ragged_paged_attention(
    q,
    k_pool,
    v_pool,
    kv_slot,
    block_tables,
    seq_lens,
    query_start_loc,
    num_seqs,
    tiling=tiling,
    sm_scale=float(sm_scale) * float(k_scale),
    v_scale=float(v_scale),
    sliding_window=sliding_window,
    soft_cap=None if soft_cap is None else float(soft_cap),
    interpret=interpret,
  )
