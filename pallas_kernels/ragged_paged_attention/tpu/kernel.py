"""The TPU ragged paged attention kernel's body (Pallas Mosaic): what one grid step (h, b)
computes. tpu.py launches it (the query regrouping, grid, scratch, scalar prefetch) and validates
its inputs; the design (work items, double-buffered page DMAs, online softmax, masks) is
described there.

The refs and their shapes (scalar-prefetched, in SMEM): block_tables int32[S * pages_per_seq]
(flattened), seq_lens int32[S], query_start_loc int32[S + 1], num_seqs int32[1], first_seq
int32[num_q_blocks] (the first sequence overlapping each token block), kv_slot int32[1] (the
stacked pool's slot this layer reads); q / o [rows, head_dim] (the step's block of q_t, rows =
num_queries_per_block * G); k_hbm / v_hbm [num_slots, num_kv_heads, num_pages, page_size,
head_dim], the stacked pool left in HBM, whose pages are DMA'd at (kv_slot, kv head, page id);
scratch: K and V double buffers [2, kv_block,
head_dim], DMA semaphores [K/V, slot], and the float32 softmax state m, l [rows, 128] and acc
[rows, head_dim].
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.ragged_paged_attention.kv_quant import is_quantized
from pallas_kernels.ragged_paged_attention.reference import MASK_VALUE

NUM_LANES = 128


def sublane_tile(dtype: jnp.dtype) -> int:
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


def attention_kernel(
  block_tables_ref,
  seq_lens_ref,
  query_start_ref,
  num_seqs_ref,
  first_seq_ref,
  kv_slot_ref,
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
  page_size = k_hbm.shape[3]
  kv_slot = kv_slot_ref[0]
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
          pltpu.make_async_copy(
            k_hbm.at[kv_slot, kv_head, page_id], k_buf.at[slot, dst], sems.at[0, slot]
          ),
          pltpu.make_async_copy(
            v_hbm.at[kv_slot, kv_head, page_id], v_buf.at[slot, dst], sems.at[1, slot]
          ),
        )
      )
    return copies

  def start_fetch(seq_id, kv_blk, slot):
    for needed, k_copy, v_copy in page_copies(seq_id, kv_blk, slot):

      @pl.when(needed)
      def _(k_copy=k_copy, v_copy=v_copy):
        k_copy.start()
        v_copy.start()

  def wait_fetch(seq_id, kv_blk, slot):
    for needed, k_copy, v_copy in page_copies(seq_id, kv_blk, slot):

      @pl.when(needed)
      def _(k_copy=k_copy, v_copy=v_copy):
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
