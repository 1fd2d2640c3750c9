"""Ragged paged attention for TPU in Pallas Mosaic (mixed decode and prefill batches): the
validated wrapper and launch; the kernel's body is kernel.py.

Grid and work split. The wrapper regroups queries as q_t[num_kv_heads, T * G, head_dim]
(G = num_q_heads // num_kv_heads; row r of a token block is token r // G, query head r % G), so the
G query heads sharing a KV head form one matrix and each K/V page is fetched once per KV head.
The grid is (num_kv_heads, num_q_blocks); a step owns `num_queries_per_block` consecutive tokens of
one KV head, which may belong to several sequences (a decode is one token). It walks a flat list of
work items (sequence, kv block): the sequences overlapping its tokens and, for each, only the kv
blocks some of its tokens can see (causal and sliding-window bounds skip the rest). Masks need no
integer division: row r sees kv position p iff r >= (p - ctx_len + q_start - blk_start) * G.

Memory. K/V pages stay in HBM (memory_space=ANY): the stacked pool [num_slots, num_kv_heads,
num_pages, page_size, head_dim] of every layer, whose slot kv_slot (scalar-prefetched) is the
leading index of every page DMA. They are copied page by page HBM -> VMEM by async DMAs into one of
two VMEM slots; while an item is computed, the next item's pages (same or next sequence) are in
flight (double buffering). Pages past the sequence or before the window are not copied; their stale
VMEM rows are masked out of the scores and zeroed in V. The online softmax state (m, l
lane-broadcast to [rows, 128]; acc [rows, head_dim]) is float32 VMEM scratch; rows of other
sequences see an all-masked block, which leaves their state exactly unchanged. A step starts
and waits all of its own DMAs, so both grid axes are "parallel" (megacore splits them).

Layout requirements (Mosaic tiling): head_dim in (64, 128, 256); page_size in (16, 32, 64) (a
multiple of the 8-row float32 / 16-row bfloat16 sublane tile); num_kv_pages_per_block * page_size a
multiple of 128 (lane-dense scores); num_queries_per_block * G a multiple of the sublane tile.
block_tables (flattened), seq_lens, query_start_loc, num_seqs and kv_slot are scalar-prefetched into
SMEM, so S * pages_per_seq must fit SMEM. Matmuls accumulate in float32 (HIGHEST precision for
float32); probabilities are cast to the V dtype before P @ V. 8-bit pages (int8, float8_e4m3fn: K /
k_scale and V / v_scale, kv_quant.py) are copied 8-bit (half the DMA bytes of bfloat16) and cast to
q's dtype in VMEM; k_scale is folded into sm_scale and v_scale multiplies the output; their sublane
tile is 32 rows, so page_size is 32 or 64. Cost note: a decode token is its own item and still runs
the [num_queries_per_block * G, kv_block] matmul of its block, masked to its G rows."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.ragged_paged_attention.kv_quant import check_scales, is_quantized
from pallas_kernels.ragged_paged_attention.tpu.kernel import (
  NUM_LANES,
  attention_kernel,
  sublane_tile,
)
from pallas_kernels.ragged_paged_attention.tpu.write import write_kv
from pallas_kernels.ragged_paged_attention.validate import (
  SUPPORTED_HEAD_DIMS,
  validate_attention_inputs,
)

__all__ = ["ragged_paged_attention", "write_kv", "SUPPORTED_PAGE_SIZES"]

SUPPORTED_PAGE_SIZES = (16, 32, 64)
DEFAULT_KV_TOKENS_PER_BLOCK = 256
DEFAULT_QUERIES_PER_BLOCK = 32


def _check_block_sizes(q, k_pool, num_queries_per_block, num_kv_pages_per_block):
  _, num_q_heads, _ = q.shape
  _, num_kv_heads, _, page_size, _ = k_pool.shape
  group = num_q_heads // num_kv_heads
  if page_size not in SUPPORTED_PAGE_SIZES:
    raise ValueError(
      f"ragged_paged_attention: k_pool: page_size {page_size} not supported "
      f"(supported: {SUPPORTED_PAGE_SIZES})"
    )
  if q.dtype not in (jnp.float32, jnp.bfloat16) or not (
    k_pool.dtype in (jnp.float32, jnp.bfloat16) or is_quantized(k_pool.dtype)
  ):
    raise ValueError(
      f"ragged_paged_attention: q/k_pool: dtypes {q.dtype}/{k_pool.dtype} not "
      "supported (q float32 or bfloat16; pages those, float8_e4m3fn or int8)"
    )
  tile = max(sublane_tile(q.dtype), sublane_tile(k_pool.dtype))
  if page_size % tile:
    raise ValueError(
      f"ragged_paged_attention: k_pool: page_size {page_size} is not a multiple "
      f"of the {tile}-row sublane tile of {k_pool.dtype}"
    )
  if num_kv_pages_per_block < 1 or (num_kv_pages_per_block * page_size) % NUM_LANES:
    raise ValueError(
      f"ragged_paged_attention: num_kv_pages_per_block: {num_kv_pages_per_block} "
      f"pages of {page_size} tokens are not a positive multiple of {NUM_LANES}"
    )
  if num_queries_per_block < 1 or (num_queries_per_block * group) % tile:
    raise ValueError(
      f"ragged_paged_attention: num_queries_per_block: {num_queries_per_block} "
      f"tokens x {group} heads per kv head: not a positive multiple of {tile}"
    )


@functools.partial(
  jax.jit,
  static_argnames=(
    "sm_scale",
    "sliding_window",
    "soft_cap",
    "k_scale",
    "v_scale",
    "num_queries_per_block",
    "num_kv_pages_per_block",
    "vmem_limit_bytes",
    "interpret",
  ),
)
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
  k_scale: float = 1.0,
  v_scale: float = 1.0,
  num_queries_per_block: int = DEFAULT_QUERIES_PER_BLOCK,
  num_kv_pages_per_block: int | None = None,
  vmem_limit_bytes: int | None = None,
  interpret: bool = False,
) -> jax.Array:  # [T, num_q_heads, head_dim], q.dtype
  """Ragged paged attention; semantics exactly those of `ragged_paged_attention_reference`.

  q holds the query tokens of all sequences concatenated (decodes first, then prefill chunks);
  k_pool/v_pool the stacked paged cache of every layer, of which this call reads slot kv_slot
  (already holding this step's K/V; in [0, num_slots), not checked on the device); block_tables the
  page ids of each sequence slot; seq_lens the cached tokens per sequence after this step;
  query_start_loc the token offsets of each sequence in q; num_seqs the live sequence count.
  num_kv_pages_per_block defaults to DEFAULT_KV_TOKENS_PER_BLOCK // page_size. `interpret=True`
  runs the kernel in Pallas TPU interpret mode (any backend, e.g. CPU tests). Shapes: q [T,
  num_q_heads, head_dim]; k_pool/v_pool [num_slots, num_kv_heads, num_pages, page_size, head_dim]
  (float32, bfloat16, or 8-bit float8_e4m3fn / int8 holding K / k_scale and V / v_scale); kv_slot
  int32[1]; block_tables int32[S, pages_per_seq]; seq_lens int32[S]; query_start_loc int32[S + 1];
  num_seqs int32[1]; returns [T, num_q_heads, head_dim] in q.dtype. Raises ValueError on bad shapes,
  dtypes, scales or block sizes.
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
  num_tokens, num_q_heads, head_dim = q.shape
  _, num_kv_heads, _, page_size, _ = k_pool.shape
  num_seq_slots, pages_per_seq = block_tables.shape
  group = num_q_heads // num_kv_heads
  if num_kv_pages_per_block is None:
    num_kv_pages_per_block = max(1, DEFAULT_KV_TOKENS_PER_BLOCK // page_size)
  _check_block_sizes(q, k_pool, num_queries_per_block, num_kv_pages_per_block)

  num_q_blocks = pl.cdiv(num_tokens, num_queries_per_block)
  padded_tokens = num_q_blocks * num_queries_per_block
  rows = num_queries_per_block * group
  q_t = jnp.pad(q, ((0, padded_tokens - num_tokens), (0, 0), (0, 0)))
  q_t = q_t.reshape(padded_tokens, num_kv_heads, group, head_dim).transpose(1, 0, 2, 3)
  q_t = q_t.reshape(num_kv_heads, padded_tokens * group, head_dim)  # [KVH, T' * G, head_dim]
  blk_starts = jnp.arange(num_q_blocks, dtype=jnp.int32) * num_queries_per_block
  first_seq = jnp.searchsorted(query_start_loc[1:], blk_starts, side="right").astype(jnp.int32)

  kv_block = num_kv_pages_per_block * page_size
  q_spec = pl.BlockSpec((pl.Squeezed(), rows, head_dim), lambda h, b, *_: (h, b, 0))
  kernel = functools.partial(
    attention_kernel,
    group=group,
    pages_per_block=num_kv_pages_per_block,
    pages_per_seq=pages_per_seq,
    sm_scale=float(sm_scale) * float(k_scale),
    v_scale=float(v_scale),
    sliding_window=sliding_window,
    soft_cap=soft_cap,
  )
  out = pl.pallas_call(
    kernel,
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=6,
      grid=(num_kv_heads, num_q_blocks),
      in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
      out_specs=q_spec,
      scratch_shapes=[
        pltpu.VMEM((2, kv_block, head_dim), k_pool.dtype),  # K double buffer
        pltpu.VMEM((2, kv_block, head_dim), v_pool.dtype),  # V double buffer
        pltpu.SemaphoreType.DMA((2, 2)),  # [K/V, slot]
        pltpu.VMEM((rows, NUM_LANES), jnp.float32),  # m
        pltpu.VMEM((rows, NUM_LANES), jnp.float32),  # l
        pltpu.VMEM((rows, head_dim), jnp.float32),  # acc
      ],
    ),
    out_shape=jax.ShapeDtypeStruct(q_t.shape, q.dtype),
    compiler_params=pltpu.CompilerParams(
      dimension_semantics=("parallel", "parallel"), vmem_limit_bytes=vmem_limit_bytes
    ),
    interpret=pltpu.InterpretParams() if interpret else False,
    name="ragged_paged_attention",
  )(
    block_tables.reshape(num_seq_slots * pages_per_seq),
    seq_lens,
    query_start_loc,
    num_seqs,
    first_seq,
    kv_slot,
    q_t,
    k_pool,
    v_pool,
  )
  out = out.reshape(num_kv_heads, padded_tokens, group, head_dim).transpose(1, 0, 2, 3)
  return out.reshape(padded_tokens, num_q_heads, head_dim)[:num_tokens]
