"""Paged KV write for TPU in Pallas Mosaic: this step's new K/V scattered into their page slots.

The stacked pools [num_slots, num_kv_heads, num_pages, page_size, head_dim] stay in HBM
(memory_space=ANY) and are aliased input -> output, so under jit with donated pools the cache is
updated in place and only the touched rows of slot kv_slot move (the other slots are untouched).
kv_slot and slot_mapping are scalar-prefetched into SMEM, kv_slot the leading index of every
DMA; the grid walks blocks of `num_tokens_per_block` tokens. By cache dtype:
* 32-bit (float32): one strided DMA per token copies its [KVH, head_dim] row of new_k (in HBM)
  into k_pool[kv_slot, :, page, offset, :] (likewise V); all DMAs of a block are in flight together.
* 16-bit (bfloat16): HBM tiles pack row pairs, so a lone row at an arbitrary offset cannot be a
  DMA target. The 16-row tile-aligned chunk holding the slot is read into VMEM, the new row (from a
  VMEM block of new_k) is merged with a select, and the chunk is written back once the next token
  targets another chunk: a prefill run costs one read and one write per 16 tokens, a decode token
  one each. Requires page_size % 16 == 0.
* 8-bit (int8, float8_e4m3fn: new_k / k_scale and new_v / v_scale, kv_quant.py): the wrapper
  quantizes the step's rows (one elementwise pass over [T, KVH, D]), then as 16-bit with the
  32-row tile of 8-bit data (page_size % 32 == 0); the merge selects in the 8-bit dtype.
Slots outside [0, num_pages * page_size) are skipped, as the reference's mode="drop" scatter does.
Tokens sharing a slot (padding tokens all aim at the null page 0) land in an unspecified order, as
in the reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.ragged_paged_attention.kv_quant import check_scales, is_quantized, quantize_kv
from pallas_kernels.ragged_paged_attention.validate import validate_write_inputs

DEFAULT_TOKENS_PER_BLOCK = 64


def _slot_location(slot, num_slots, page_size):
  """(valid, page_id, offset) of a flat slot; invalid slots map to (False, 0, 0)."""
  valid = (slot >= 0) & (slot < num_slots)
  slot = jnp.where(valid, slot, 0)
  return valid, lax.div(slot, page_size), lax.rem(slot, page_size)


def _row_dma_kernel(
  kv_slot_ref,
  slot_ref,
  new_k_hbm,
  new_v_hbm,
  k_in,
  v_in,
  k_hbm,
  v_hbm,
  sems,
  *,
  tokens_per_block,
  num_tokens,
):
  """32-bit caches: one [KVH, head_dim] row DMA per token, HBM -> HBM, all in flight at once."""
  del k_in, v_in  # aliased with k_hbm / v_hbm
  _, _, num_pages, page_size, _ = k_hbm.shape
  kv_slot = kv_slot_ref[0]
  first = pl.program_id(0) * tokens_per_block
  count = jnp.minimum(tokens_per_block, num_tokens - first)

  def copies(i):
    token = first + i
    valid, page_id, offset = _slot_location(slot_ref[token], num_pages * page_size, page_size)
    k_row, v_row = (hbm.at[kv_slot, :, page_id, offset] for hbm in (k_hbm, v_hbm))  # [KVH, D]
    k_copy = pltpu.make_async_copy(new_k_hbm.at[token], k_row, sems.at[0])
    v_copy = pltpu.make_async_copy(new_v_hbm.at[token], v_row, sems.at[1])
    return valid, k_copy, v_copy

  def start(i, carry):
    valid, k_copy, v_copy = copies(i)

    @pl.when(valid)
    def _():
      k_copy.start()
      v_copy.start()

    return carry

  def wait(i, carry):
    valid, k_copy, v_copy = copies(i)

    @pl.when(valid)
    def _():
      k_copy.wait()
      v_copy.wait()

    return carry

  lax.fori_loop(0, count, start, 0)
  lax.fori_loop(0, count, wait, 0)


def _chunk_rmw_kernel(
  kv_slot_ref,
  slot_ref,
  new_k_ref,
  new_v_ref,
  k_in,
  v_in,
  k_hbm,
  v_hbm,
  k_buf,
  v_buf,
  sems,
  *,
  tokens_per_block,
  num_tokens,
):
  """Packed (16-bit) caches: rows cannot be DMAed alone, so the tile-aligned chunk holding a slot
  is read into VMEM, the row is merged in, and the chunk is written back when the next token
  targets another chunk (consecutive prefill tokens share one read and one write)."""
  del k_in, v_in  # aliased with k_hbm / v_hbm
  _, _, num_pages, page_size, _ = k_hbm.shape
  kv_slot = kv_slot_ref[0]
  chunk_rows = k_buf.shape[1]
  first = pl.program_id(0) * tokens_per_block
  count = jnp.minimum(tokens_per_block, num_tokens - first)

  def chunk_copies(chunk_id):  # HBM views of chunk `chunk_id` (flat slot // chunk_rows)
    page_id = lax.div(chunk_id * chunk_rows, page_size)
    start = pl.multiple_of(lax.rem(chunk_id * chunk_rows, page_size), chunk_rows)
    rows = pl.ds(start, chunk_rows)
    return (
      (k_hbm.at[kv_slot, :, page_id, rows], k_buf, sems.at[0]),
      (v_hbm.at[kv_slot, :, page_id, rows], v_buf, sems.at[1]),
    )

  def transfer(chunk_id, to_vmem):
    copies = [
      pltpu.make_async_copy(*((buf, hbm, sem) if not to_vmem else (hbm, buf, sem)))
      for hbm, buf, sem in chunk_copies(chunk_id)
    ]
    for copy in copies:
      copy.start()
    for copy in copies:
      copy.wait()

  def body(i, open_chunk):
    valid, page_id, offset = _slot_location(slot_ref[first + i], num_pages * page_size, page_size)
    chunk_id = lax.div(page_id * page_size + offset, chunk_rows)

    @pl.when(valid & (chunk_id != open_chunk))
    def _():
      @pl.when(open_chunk >= 0)
      def _():
        transfer(open_chunk, to_vmem=False)

      transfer(chunk_id, to_vmem=True)

    @pl.when(valid)
    def _():
      row = lax.broadcasted_iota(jnp.int32, k_buf.shape, 1)  # [KVH, chunk_rows, D]
      hit = row == lax.rem(offset, chunk_rows)
      for new_ref, buf in ((new_k_ref, k_buf), (new_v_ref, v_buf)):
        if is_quantized(buf.dtype):  # 8-bit rows are selected as they are
          buf[...] = jnp.where(hit, new_ref[i][:, None, :], buf[...])
          continue
        new_row = new_ref[i].astype(jnp.float32)[:, None, :]  # [KVH, 1, D]
        merged = jnp.where(hit, new_row, buf[...].astype(jnp.float32))
        buf[...] = merged.astype(buf.dtype)

    return jnp.where(valid, chunk_id, open_chunk)

  open_chunk = lax.fori_loop(0, count, body, jnp.int32(-1))

  @pl.when(open_chunk >= 0)
  def _():
    transfer(open_chunk, to_vmem=False)


@functools.partial(
  jax.jit, static_argnames=("num_tokens_per_block", "k_scale", "v_scale", "interpret")
)
def write_kv(
  k_pool: jax.Array,  # [num_slots, num_kv_heads, num_pages, page_size, head_dim]
  v_pool: jax.Array,  # [num_slots, num_kv_heads, num_pages, page_size, head_dim]
  kv_slot: jax.Array,  # int32[1]: the slot this layer writes
  new_k: jax.Array,  # [T, num_kv_heads, head_dim]
  new_v: jax.Array,  # [T, num_kv_heads, head_dim]
  slot_mapping: jax.Array,  # int32[T]: page_id * page_size + offset; padding tokens -> page 0
  *,
  num_tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK,
  k_scale: float = 1.0,
  v_scale: float = 1.0,
  interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:  # (k_pool, v_pool) with the new rows written
  """Writes new_k/new_v into their token slots of pool slot kv_slot; semantics of
  `write_kv_reference`. Shapes: k_pool/v_pool [num_slots, num_kv_heads, num_pages, page_size,
  head_dim], kv_slot int32[1] (in [0, num_slots), not checked on the device), new_k/new_v
  [T, num_kv_heads, head_dim], slot_mapping int32[T].

  Donate k_pool/v_pool under jit for an in-place update. 8-bit pages (float8_e4m3fn, int8)
  get new_k / k_scale and new_v / v_scale quantized (float pages: scales 1.0). `interpret=True`
  runs the kernel in Pallas TPU interpret mode. Raises ValueError on bad shapes, dtypes, scales
  or block size.
  """
  validate_write_inputs(k_pool, v_pool, kv_slot, new_k, new_v, slot_mapping)
  check_scales(k_pool.dtype, k_scale, v_scale, "write_kv")
  if num_tokens_per_block < 1:
    raise ValueError(f"write_kv: num_tokens_per_block: must be >= 1, got {num_tokens_per_block}")
  num_tokens = new_k.shape[0]
  if num_tokens == 0:
    return k_pool, v_pool
  _, num_kv_heads, _, page_size, head_dim = k_pool.shape
  dtype = k_pool.dtype
  any_spec = pl.BlockSpec(memory_space=pl.ANY)
  semaphores = pltpu.SemaphoreType.DMA((2,))
  if jnp.dtype(dtype).itemsize == 4:
    kernel, new_spec, scratch = _row_dma_kernel, any_spec, [semaphores]
  else:
    chunk_rows = 8 * 4 // jnp.dtype(dtype).itemsize
    if page_size % chunk_rows:
      raise ValueError(
        f"write_kv: k_pool: page_size {page_size} is not a multiple of the "
        f"{chunk_rows}-row tile of {dtype}"
      )
    kernel = _chunk_rmw_kernel
    new_spec = pl.BlockSpec((num_tokens_per_block, num_kv_heads, head_dim), lambda b, *_: (b, 0, 0))
    scratch = [pltpu.VMEM((num_kv_heads, chunk_rows, head_dim), dtype)] * 2 + [semaphores]
  return pl.pallas_call(
    functools.partial(kernel, tokens_per_block=num_tokens_per_block, num_tokens=num_tokens),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2,
      grid=(pl.cdiv(num_tokens, num_tokens_per_block),),
      in_specs=[new_spec, new_spec, any_spec, any_spec],
      out_specs=[any_spec] * 2,
      scratch_shapes=scratch,
    ),
    out_shape=[
      jax.ShapeDtypeStruct(k_pool.shape, dtype),
      jax.ShapeDtypeStruct(v_pool.shape, dtype),
    ],
    input_output_aliases={4: 0, 5: 1},
    compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    interpret=pltpu.InterpretParams() if interpret else False,
    name="write_kv",
  )(
    kv_slot,
    slot_mapping,
    quantize_kv(new_k, dtype, k_scale),
    quantize_kv(new_v, dtype, v_scale),
    k_pool,
    v_pool,
  )
