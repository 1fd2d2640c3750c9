"""Pallas GPU (Triton) kernel that writes one step's new K/V into their cache pages, in place.

Grid: (cdiv(num_tokens, block_tokens), num_kv_heads). A program loads `block_tokens` slot ids,
splits each into (page_id, offset) and stores the tokens' K and V rows of one kv head at those
pages of the stacked pool's slot kv_slot[0] (a one-element int32 input, the stores' dynamic
leading index). The pools are aliased input -> output (`input_output_aliases`), so under jit
with donated pools XLA hands the kernel the cache buffer itself and nothing but the new rows
moves; the other slots are untouched.
Slots outside [0, num_pages * page_size) are skipped, matching the reference's mode="drop".
8-bit pages (float8_e4m3fn, int8): the wrapper quantizes the step's new rows (new_k / k_scale,
new_v / v_scale, kv_quant.quantize_kv: one elementwise pass over [T, KVH, D]) and the kernel
stores the 8-bit rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.ragged_paged_attention.kv_quant import check_scales, quantize_kv
from pallas_kernels.ragged_paged_attention.validate import validate_write_inputs
from pallas_kernels.triton_params import triton_compiler_params

DEFAULT_BLOCK_TOKENS = 16


def _write_kernel(
  kv_slot_ref,
  slot_ref,
  new_k_ref,
  new_v_ref,
  _k_in_ref,
  _v_in_ref,
  k_out_ref,
  v_out_ref,
  *,
  block_tokens: int,
  num_tokens: int,
):
  _, num_pages, page_size, head_dim = k_out_ref.shape  # every slot's pages of one kv head
  kv_slot = kv_slot_ref[0]
  tokens = pl.program_id(0) * block_tokens + jnp.arange(block_tokens, dtype=jnp.int32)  # [BT]
  token_valid = tokens < num_tokens  # [BT]
  slots = plgpu.load(slot_ref.at[tokens], mask=token_valid, other=-1)  # [BT]
  valid = token_valid & (slots >= 0) & (slots < num_pages * page_size)  # [BT]
  page_ids = jnp.where(valid, slots // page_size, num_pages)[:, None]  # [BT, 1]
  offsets = jnp.where(valid, slots % page_size, 0)[:, None]  # [BT, 1]
  dims = jnp.arange(head_dim, dtype=jnp.int32)[None, :]  # [1, D]
  rows = jnp.where(token_valid, tokens, num_tokens)[:, None]  # [BT, 1]
  row_mask = jnp.broadcast_to(token_valid[:, None], (block_tokens, head_dim))
  page_mask = jnp.broadcast_to(valid[:, None], (block_tokens, head_dim))
  for new_ref, out_ref in ((new_k_ref, k_out_ref), (new_v_ref, v_out_ref)):
    fill = jnp.zeros((), new_ref.dtype)  # typed: a Python 0 does not cast to an 8-bit float
    rows_kv = plgpu.load(new_ref.at[rows, dims], mask=row_mask, other=fill)  # [BT, D]
    index = (kv_slot, page_ids, offsets, dims)  # the slot's page rows of this kv head
    plgpu.store(out_ref.at[index], rows_kv.astype(out_ref.dtype), mask=page_mask)


@functools.partial(jax.jit, static_argnames=("block_tokens", "num_warps", "interpret"))
def _write_kv(
  k_pool,
  v_pool,
  kv_slot,
  new_k,
  new_v,
  slot_mapping,
  *,
  block_tokens: int,
  num_warps: int,
  interpret: bool,
):
  num_slots, num_kv_heads, num_pages, page_size, head_dim = k_pool.shape
  num_tokens = new_k.shape[0]
  pages_spec = pl.BlockSpec(
    (num_slots, None, num_pages, page_size, head_dim), lambda i, h: (0, h, 0, 0, 0)
  )  # [num_slots, num_pages, page_size, D]: kv head h of every slot
  new_spec = pl.BlockSpec((num_tokens, None, head_dim), lambda i, h: (0, h, 0))
  kernel = functools.partial(_write_kernel, block_tokens=block_tokens, num_tokens=num_tokens)
  return pl.pallas_call(
    kernel,
    grid=(pl.cdiv(num_tokens, block_tokens), num_kv_heads),
    in_specs=[pl.no_block_spec, pl.no_block_spec, new_spec, new_spec, pages_spec, pages_spec],
    out_specs=[pages_spec, pages_spec],
    out_shape=[
      jax.ShapeDtypeStruct(k_pool.shape, k_pool.dtype),
      jax.ShapeDtypeStruct(v_pool.shape, v_pool.dtype),
    ],
    input_output_aliases={4: 0, 5: 1},
    compiler_params=triton_compiler_params(num_warps, 1),
    interpret=interpret,
    name="write_kv_pages",
  )(kv_slot, slot_mapping, new_k, new_v, k_pool, v_pool)


def write_kv(
  k_pool: jax.Array,  # [num_slots, num_kv_heads, num_pages, page_size, head_dim]
  v_pool: jax.Array,  # [num_slots, num_kv_heads, num_pages, page_size, head_dim]
  kv_slot: jax.Array,  # int32[1]: the slot this layer writes
  new_k: jax.Array,  # [T, num_kv_heads, head_dim]
  new_v: jax.Array,  # [T, num_kv_heads, head_dim]
  slot_mapping: jax.Array,  # int32[T]: page_id * page_size + offset; padding tokens -> page 0
  *,
  block_tokens: int = DEFAULT_BLOCK_TOKENS,
  num_warps: int = 4,
  k_scale: float = 1.0,
  v_scale: float = 1.0,
  interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """Writes new_k/new_v into the token slots of slot_mapping in pool slot kv_slot; returns
  (k_pool, v_pool).

  Same semantics as `write_kv_reference`. The pools are aliased to the outputs: donate them under
  jit for a true in-place update. `block_tokens` (a power of two) tokens are written per program;
  `interpret=True` runs the same kernel through the Pallas interpreter (works on CPU). Shapes:
  k_pool/v_pool [num_slots, num_kv_heads, num_pages, page_size, head_dim] (float32, bfloat16, or
  8-bit: float8_e4m3fn / int8 holding new_k / k_scale and new_v / v_scale), kv_slot int32[1] (in
  [0, num_slots), not checked on the device), new_k/new_v [T, num_kv_heads, head_dim],
  slot_mapping int32[T]. Raises ValueError on bad shapes, dtypes, scales or block sizes.
  """
  validate_write_inputs(k_pool, v_pool, kv_slot, new_k, new_v, slot_mapping)
  check_scales(k_pool.dtype, k_scale, v_scale, "write_kv")
  if block_tokens < 1 or block_tokens & (block_tokens - 1):
    raise ValueError(f"write_kv: block_tokens: must be a power of two, got {block_tokens}")
  head_dim = k_pool.shape[-1]
  if head_dim & (head_dim - 1):
    raise ValueError(f"write_kv: k_pool: head_dim {head_dim} is not a power of two")
  if new_k.shape[0] == 0:
    return k_pool, v_pool
  return _write_kv(
    k_pool,
    v_pool,
    kv_slot,
    quantize_kv(new_k, k_pool.dtype, k_scale),
    quantize_kv(new_v, v_pool.dtype, v_scale),
    slot_mapping,
    block_tokens=block_tokens,
    num_warps=num_warps,
    interpret=interpret,
  )
