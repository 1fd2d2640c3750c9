"""Ragged paged attention for TPU in Pallas Mosaic (mixed decode and prefill batches).

Grid and work split. The wrapper regroups queries as q_t[num_kv_heads, T * G, head_dim]
(G = num_q_heads // num_kv_heads; row r of a token block is token r // G, query head r % G), so the
G query heads sharing a KV head form one matrix and each K/V page is fetched once per KV head.
The grid is (num_kv_heads, num_q_blocks); a step owns `num_queries_per_block` consecutive tokens of
one KV head, which may belong to several sequences (a decode is one token). It walks a flat list of
work items (sequence, kv block): the sequences overlapping its tokens and, for each, only the kv
blocks some of its tokens can see (causal and sliding-window bounds skip the rest). Masks need no
integer division: row r sees kv position p iff r >= (p - ctx_len + q_start - blk_start) * G.

Memory. K/V pages stay in HBM (memory_space=ANY) and are copied page by page HBM -> VMEM by async
DMAs into one of two VMEM slots; while an item is computed, the next item's pages (same or next
sequence) are in flight (double buffering). Pages past the sequence or before the window are not
copied; their stale VMEM rows are masked out of the scores and zeroed in V. The online softmax
state (m, l lane-broadcast to [rows, 128]; acc [rows, head_dim]) is float32 VMEM scratch; rows of
other sequences see an all-masked block, which leaves their state exactly unchanged. A step starts
and waits all of its own DMAs, so both grid axes are "parallel" (megacore splits them).

Layout requirements (Mosaic tiling): head_dim in (64, 128, 256); page_size in (16, 32, 64) (a
multiple of the 8-row float32 / 16-row bfloat16 sublane tile); num_kv_pages_per_block * page_size
a multiple of 128 (lane-dense scores); num_queries_per_block * G a multiple of the sublane tile.
block_tables (flattened), seq_lens, query_start_loc and num_seqs are scalar-prefetched into SMEM,
so S * pages_per_seq must fit SMEM. Matmuls accumulate in float32 (HIGHEST precision for float32);
probabilities are cast to the V dtype before P @ V. 8-bit pages (int8, float8_e4m3fn: K / k_scale
and V / v_scale, kv_quant.py) are copied 8-bit (half the DMA bytes of bfloat16) and cast to q's
dtype in VMEM; k_scale is folded into sm_scale and v_scale multiplies the output; their sublane
tile is 32 rows, so page_size is 32 or 64. Cost note: a decode token is its own item and
still runs the [num_queries_per_block * G, kv_block] matmul of its block, masked to its G rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.ragged_paged_attention.kv_quant import check_scales, is_quantized
from pallas_kernels.ragged_paged_attention.reference import MASK_VALUE
from pallas_kernels.ragged_paged_attention.tpu_write import write_kv
from pallas_kernels.ragged_paged_attention.validate import (
  SUPPORTED_HEAD_DIMS,
  validate_attention_inputs,
)

__all__ = ["ragged_paged_attention", "write_kv", "SUPPORTED_PAGE_SIZES"]

NUM_LANES = 128
SUPPORTED_PAGE_SIZES = (16, 32, 64)
DEFAULT_KV_TOKENS_PER_BLOCK = 256
DEFAULT_QUERIES_PER_BLOCK = 32


def _sublane_tile(dtype: jnp.dtype) -> int:
  return 8 * (4 // jnp.dtype(dtype).itemsize)


def _lanes(x: jax.Array, width: int) -> jax.Array:
  """[rows, 128] lane-broadcast value -> [rows, width]."""
  if width <= NUM_LANES:
    return x[:, :width]
  return jnp.tile(x, (1, width // NUM_LANES))


class _SeqBlock:
  """Scalar bounds of sequence `seq_id` restricted to the token block [blk_start, blk_end)."""

  def __init__(self, refs, seq_id, blk_start, blk_end, *, kv_block, sliding_window):
    seq_lens_ref, query_start_ref = refs
    sid = jnp.minimum(seq_id, seq_lens_ref.shape[0] - 1)
    self.q_start = query_start_ref[sid]
    q_end = query_start_ref[sid + 1]
    self.ctx_len = seq_lens_ref[sid] - (q_end - self.q_start)  # cached tokens before this step
    self.row_lo = jnp.maximum(self.q_start, blk_start) - blk_start
    self.row_hi = jnp.minimum(q_end, blk_end) - blk_start
    pos_lo = self.ctx_len + self.row_lo + blk_start - self.q_start
    self.kv_hi = self.ctx_len + self.row_hi + blk_start - self.q_start  # exclusive
    self.kv_lo = 0 if sliding_window is None else jnp.maximum(pos_lo - sliding_window + 1, 0)
    self.kv_lo = jnp.minimum(self.kv_lo, self.kv_hi)
    self.blk_lo = lax.div(self.kv_lo, kv_block)
    has_rows = self.row_lo < self.row_hi
    self.blk_hi = jnp.where(
      has_rows & (self.kv_hi > 0), lax.div(self.kv_hi + kv_block - 1, kv_block), self.blk_lo
    )


def _kernel(
  block_tables_ref,
  seq_lens_ref,
  query_start_ref,
  num_seqs_ref,
  first_seq_ref,
  q_ref,
  k_hbm,
  v_hbm,
  o_ref,
  k_buf,
  v_buf,
  sems,
  m_ref,
  l_ref,
  acc_ref,
  *,
  group,
  pages_per_block,
  pages_per_seq,
  sm_scale,
  v_scale,
  sliding_window,
  soft_cap,
):
  kv_head, q_blk = pl.program_id(0), pl.program_id(1)
  rows, head_dim = q_ref.shape
  page_size = k_hbm.shape[2]
  kv_block = pages_per_block * page_size
  tokens_per_block = rows // group
  blk_start = q_blk * tokens_per_block
  blk_end = blk_start + tokens_per_block
  num_seqs = jnp.minimum(num_seqs_ref[0], seq_lens_ref.shape[0])
  seq_block = functools.partial(
    _SeqBlock,
    (seq_lens_ref, query_start_ref),
    blk_start=blk_start,
    blk_end=blk_end,
    kv_block=kv_block,
    sliding_window=sliding_window,
  )

  def live(seq_id):
    return (seq_id < num_seqs) & (query_start_ref[jnp.minimum(seq_id, num_seqs)] < blk_end)

  def skip_idle(seq_id):
    """First sequence >= seq_id that has work in this block, or a non-live id."""

    def idle(s):
      sb = seq_block(s)
      return live(s) & (sb.blk_hi <= sb.blk_lo)

    return lax.while_loop(idle, lambda s: s + 1, seq_id)

  def page_copies(seq_id, kv_blk, slot):
    """(condition, k copy, v copy) for each page slot of item (seq_id, kv_blk)."""
    sb = seq_block(seq_id)
    first_page = lax.div(sb.kv_lo, page_size)
    end_page = jnp.minimum(lax.div(sb.kv_hi + page_size - 1, page_size), pages_per_seq)
    copies = []
    for i in range(pages_per_block):
      page_idx = kv_blk * pages_per_block + i
      needed = (page_idx >= first_page) & (page_idx < end_page)
      table_idx = jnp.minimum(seq_id, seq_lens_ref.shape[0] - 1) * pages_per_seq + jnp.minimum(
        page_idx, pages_per_seq - 1
      )
      page_id = block_tables_ref[table_idx]
      dst = pl.ds(i * page_size, page_size)
      copies.append(
        (
          needed,
          pltpu.make_async_copy(k_hbm.at[kv_head, page_id], k_buf.at[slot, dst], sems.at[0, slot]),
          pltpu.make_async_copy(v_hbm.at[kv_head, page_id], v_buf.at[slot, dst], sems.at[1, slot]),
        )
      )
    return copies

  def start_fetch(seq_id, kv_blk, slot):
    for needed, k_copy, v_copy in page_copies(seq_id, kv_blk, slot):

      @pl.when(needed)
      def _():
        k_copy.start()
        v_copy.start()

  def wait_fetch(seq_id, kv_blk, slot):
    for needed, k_copy, v_copy in page_copies(seq_id, kv_blk, slot):

      @pl.when(needed)
      def _():
        k_copy.wait()
        v_copy.wait()

  def next_item(seq_id, kv_blk):
    sb = seq_block(seq_id)
    same_seq = kv_blk + 1 < sb.blk_hi
    next_seq = lax.cond(same_seq, lambda: seq_id, lambda: skip_idle(seq_id + 1))
    next_blk = jnp.where(same_seq, kv_blk + 1, seq_block(next_seq).blk_lo)
    return next_seq, next_blk

  def compute(seq_id, kv_blk, slot):
    sb = seq_block(seq_id)
    q = q_ref[...]  # [rows, head_dim]
    k = k_buf[slot]  # [kv_block, head_dim]
    v = v_buf[slot]  # [kv_block, head_dim]
    if is_quantized(v.dtype):  # 8-bit pages: cast in VMEM, the scales applied outside
      v = v.astype(q.dtype)
    precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    s = (
      lax.dot_general(
        q,
        k.astype(q.dtype),
        (((1,), (1,)), ((), ())),
        precision=precision,
        preferred_element_type=jnp.float32,
      )
      * sm_scale
    )  # [rows, kv_block]
    if soft_cap is not None:
      s = soft_cap * jnp.tanh(s / soft_cap)
    row = lax.broadcasted_iota(jnp.int32, s.shape, 0)
    # Token offset (in this block) of the first row allowed to see each column's kv position.
    first_row_tok = lax.broadcasted_iota(jnp.int32, s.shape, 1) + (
      kv_blk * kv_block - sb.ctx_len + sb.q_start - blk_start
    )
    mask = (row >= sb.row_lo * group) & (row < sb.row_hi * group) & (row >= first_row_tok * group)
    if sliding_window is not None:
      mask &= row < (first_row_tok + sliding_window) * group
    s = jnp.where(mask, s, MASK_VALUE)
    m_prev, l_prev = m_ref[...], l_ref[...]  # [rows, 128]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))  # [rows, 128]
    p = jnp.where(mask, jnp.exp(s - _lanes(m_next, kv_block)), 0.0)  # [rows, kv_block]
    alpha = jnp.exp(m_prev - m_next)  # [rows, 128]
    m_ref[...] = m_next
    l_ref[...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
    kv_pos = lax.broadcasted_iota(jnp.int32, v.shape, 0) + kv_blk * kv_block
    v = jnp.where((kv_pos >= sb.kv_lo) & (kv_pos < sb.kv_hi), v, jnp.zeros_like(v))
    pv = lax.dot_general(
      p.astype(v.dtype),
      v,
      (((1,), (0,)), ((), ())),
      precision=precision,
      preferred_element_type=jnp.float32,
    )  # [rows, head_dim]
    acc_ref[...] = _lanes(alpha, head_dim) * acc_ref[...] + pv

  m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
  l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
  acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  first = skip_idle(first_seq_ref[q_blk])
  first_blk = seq_block(first).blk_lo

  @pl.when(live(first))
  def _():
    start_fetch(first, first_blk, 0)

  def body(carry):
    seq_id, kv_blk, slot = carry
    next_seq, next_blk = next_item(seq_id, kv_blk)

    @pl.when(live(next_seq))
    def _():
      start_fetch(next_seq, next_blk, 1 - slot)

    wait_fetch(seq_id, kv_blk, slot)
    compute(seq_id, kv_blk, slot)
    return next_seq, next_blk, 1 - slot

  lax.while_loop(lambda c: live(c[0]), body, (first, first_blk, jnp.int32(0)))
  denom = _lanes(l_ref[...], head_dim)  # [rows, head_dim]: the softmax's row sums
  out = jnp.where(denom > 0.0, acc_ref[...] / jnp.where(denom > 0.0, denom, 1.0), 0.0)
  if v_scale != 1.0:  # 8-bit V pages hold V / v_scale
    out = out * v_scale
  o_ref[...] = out.astype(o_ref.dtype)


def _check_block_sizes(q, k_pages, num_queries_per_block, num_kv_pages_per_block):
  _, num_q_heads, _ = q.shape
  num_kv_heads, _, page_size, _ = k_pages.shape
  group = num_q_heads // num_kv_heads
  if page_size not in SUPPORTED_PAGE_SIZES:
    raise ValueError(
      f"ragged_paged_attention: k_pages: page_size {page_size} not supported "
      f"(supported: {SUPPORTED_PAGE_SIZES})"
    )
  if q.dtype not in (jnp.float32, jnp.bfloat16) or not (
    k_pages.dtype in (jnp.float32, jnp.bfloat16) or is_quantized(k_pages.dtype)
  ):
    raise ValueError(
      f"ragged_paged_attention: q/k_pages: dtypes {q.dtype}/{k_pages.dtype} not "
      "supported (q float32 or bfloat16; pages those, float8_e4m3fn or int8)"
    )
  tile = max(_sublane_tile(q.dtype), _sublane_tile(k_pages.dtype))
  if page_size % tile:
    raise ValueError(
      f"ragged_paged_attention: k_pages: page_size {page_size} is not a multiple "
      f"of the {tile}-row sublane tile of {k_pages.dtype}"
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
  k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
  v_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
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
  k_pages/v_pages the paged cache of one layer (already holding this step's K/V); block_tables the
  page ids of each sequence slot; seq_lens the cached tokens per sequence after this step;
  query_start_loc the token offsets of each sequence in q; num_seqs the live sequence count.
  num_kv_pages_per_block defaults to DEFAULT_KV_TOKENS_PER_BLOCK // page_size. `interpret=True`
  runs the kernel in Pallas TPU interpret mode (any backend, e.g. CPU tests). Shapes: q
  [T, num_q_heads, head_dim]; k_pages/v_pages [num_kv_heads, num_pages, page_size, head_dim]
  (float32, bfloat16, or 8-bit float8_e4m3fn / int8 holding K / k_scale and V / v_scale);
  block_tables int32[S, pages_per_seq]; seq_lens int32[S]; query_start_loc int32[S + 1];
  num_seqs int32[1]; returns [T, num_q_heads, head_dim] in q.dtype.
  Raises ValueError on bad shapes, dtypes, scales or block sizes.
  """
  validate_attention_inputs(
    q,
    k_pages,
    v_pages,
    block_tables,
    seq_lens,
    query_start_loc,
    num_seqs,
    sliding_window=sliding_window,
    soft_cap=soft_cap,
    head_dims=SUPPORTED_HEAD_DIMS,
  )
  check_scales(k_pages.dtype, k_scale, v_scale, "ragged_paged_attention")
  num_tokens, num_q_heads, head_dim = q.shape
  num_kv_heads, _, page_size, _ = k_pages.shape
  num_seq_slots, pages_per_seq = block_tables.shape
  group = num_q_heads // num_kv_heads
  if num_kv_pages_per_block is None:
    num_kv_pages_per_block = max(1, DEFAULT_KV_TOKENS_PER_BLOCK // page_size)
  _check_block_sizes(q, k_pages, num_queries_per_block, num_kv_pages_per_block)

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
    _kernel,
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
      num_scalar_prefetch=5,
      grid=(num_kv_heads, num_q_blocks),
      in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
      out_specs=q_spec,
      scratch_shapes=[
        pltpu.VMEM((2, kv_block, head_dim), k_pages.dtype),  # K double buffer
        pltpu.VMEM((2, kv_block, head_dim), v_pages.dtype),  # V double buffer
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
    q_t,
    k_pages,
    v_pages,
  )
  out = out.reshape(num_kv_heads, padded_tokens, group, head_dim).transpose(1, 0, 2, 3)
  return out.reshape(padded_tokens, num_q_heads, head_dim)[:num_tokens]
