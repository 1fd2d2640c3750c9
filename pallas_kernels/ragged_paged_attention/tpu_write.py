"""Paged KV write for TPU in Pallas Mosaic: this step's new K/V scattered into their page slots.

The pages stay in HBM (memory_space=ANY) and are aliased input -> output, so under jit with donated
pages the cache is updated in place and only the new rows move. new_k / new_v ([T, KVH, head_dim],
cast to the cache dtype) also stay in HBM; slot_mapping is scalar-prefetched into SMEM. The grid walks
blocks of `num_tokens_per_block` tokens; for each token one strided DMA copies its [KVH, head_dim]
row of new_k into k_pages[:, page, offset, :] (and likewise for V), all DMAs of a block are started
before any is waited on. Slots outside [0, num_pages * page_size) are skipped, as the reference's
mode="drop" scatter does. Tokens sharing a slot (padding tokens all aim at the null page 0) land in
an unspecified order, as in the reference.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.ragged_paged_attention.validate import validate_write_inputs

DEFAULT_TOKENS_PER_BLOCK = 64


def _write_kernel(slot_ref, new_k_hbm, new_v_hbm, k_in, v_in, k_hbm, v_hbm, sems, *,
                  tokens_per_block, num_tokens):
  del k_in, v_in  # aliased with k_hbm / v_hbm
  _, num_pages, page_size, _ = k_hbm.shape
  first = pl.program_id(0) * tokens_per_block
  count = jnp.minimum(tokens_per_block, num_tokens - first)

  def copies(i):
    token = first + i
    slot = slot_ref[token]
    valid = (slot >= 0) & (slot < num_pages * page_size)
    slot = jnp.where(valid, slot, 0)
    page_id, offset = lax.div(slot, page_size), lax.rem(slot, page_size)
    k_copy = pltpu.make_async_copy(new_k_hbm.at[token], k_hbm.at[:, page_id, offset], sems.at[0])
    v_copy = pltpu.make_async_copy(new_v_hbm.at[token], v_hbm.at[:, page_id, offset], sems.at[1])
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


@functools.partial(jax.jit, static_argnames=("num_tokens_per_block", "interpret"))
def write_kv(
    k_pages: jax.Array,       # [num_kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,       # [num_kv_heads, num_pages, page_size, head_dim]
    new_k: jax.Array,         # [T, num_kv_heads, head_dim]
    new_v: jax.Array,         # [T, num_kv_heads, head_dim]
    slot_mapping: jax.Array,  # int32[T]: page_id * page_size + offset; padding tokens -> page 0
    *,
    num_tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:  # (k_pages, v_pages) with the new rows written
  """Writes new_k/new_v into their slots; semantics of `write_kv_reference`.

  Donate k_pages/v_pages under jit for an in-place update. `interpret=True` runs the kernel in
  Pallas TPU interpret mode. Raises ValueError on bad shapes, dtypes or block size.
  """
  validate_write_inputs(k_pages, v_pages, new_k, new_v, slot_mapping)
  if num_tokens_per_block < 1:
    raise ValueError(f"write_kv: num_tokens_per_block: must be >= 1, got {num_tokens_per_block}")
  num_tokens = new_k.shape[0]
  if num_tokens == 0:
    return k_pages, v_pages
  any_spec = pl.BlockSpec(memory_space=pl.ANY)
  kernel = functools.partial(_write_kernel, tokens_per_block=num_tokens_per_block,
                             num_tokens=num_tokens)
  return pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1,
          grid=(pl.cdiv(num_tokens, num_tokens_per_block),),
          in_specs=[any_spec] * 4,
          out_specs=[any_spec] * 2,
          scratch_shapes=[pltpu.SemaphoreType.DMA((2,))]),
      out_shape=[jax.ShapeDtypeStruct(k_pages.shape, k_pages.dtype),
                 jax.ShapeDtypeStruct(v_pages.shape, v_pages.dtype)],
      input_output_aliases={3: 0, 4: 1},
      compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
      interpret=pltpu.InterpretParams() if interpret else False,
      name="write_kv",
  )(slot_mapping, new_k.astype(k_pages.dtype), new_v.astype(v_pages.dtype), k_pages, v_pages)
