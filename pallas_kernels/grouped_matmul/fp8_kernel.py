"""The fp8 grouped matmul's Pallas (Triton) kernel and its launch: fp8.py states the design
(operands, scale kinds, the tiles a program walks) and validates the inputs; this module is what
one program computes (`_kernel`) and `fp8_call`, which launches it over a tile map with gpu.py's
Addressing (sorted rows, rows gathered by token, outputs scattered to their assignments) and adds
split K's float32 partials in an XLA epilogue.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.grouped_matmul.gpu import SORTED, Addressing, silu, store_results
from pallas_kernels.grouped_matmul.tiles import Tiling, fit_stages
from pallas_kernels.triton_params import triton_compiler_params

BLOCK = 128  # block scales: 128 x 128 weight blocks, 1 x 128 activation groups


@dataclass(frozen=True)
class _Static:
  tiling: Tiling
  num_weights: int
  steps: int  # block_k slices of K per split
  blocks: bool  # 128 x 128 weight scales (per-slice scaling), else per channel
  addressing: Addressing = SORTED  # gpu.py's: rows gathered by token, outputs scattered


def _kernel(group_ref, start_ref, count_ref, *refs, static: _Static):
  """refs: the order [M] (gathered or scattered rows) and the routing weights [M] (scattered,
  unsplit) as the addressing needs them, the e4m3 rows [M or T, K] and their scales [M or T,
  KS], weights [G, N, K] e4m3 and their scales (one pair, or gate's and up's), then the output
  [M, N] or float32 partials [S, M, N] (one per weight)."""
  t, nw, addressing = static.tiling, static.num_weights, static.addressing
  partial = t.num_splits > 1
  num_routing = addressing.num_refs(partial)
  order_ref, route_w_ref = (refs[:num_routing] + (None, None))[:2]
  x_ref, xs_ref, refs = refs[num_routing], refs[num_routing + 1], refs[num_routing + 2 :]
  w_refs, ws_refs, out_refs = refs[:nw], refs[nw : 2 * nw], refs[2 * nw :]
  bm, bn, bk = t.block_m, t.block_n, t.block_k
  num_groups = w_refs[0].shape[0]
  col_block, tile, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  group, count = group_ref[tile], count_ref[tile]
  offsets = jnp.arange(bm, dtype=jnp.int32)  # [BM]
  row_valid = offsets < count  # [BM]
  sorted_rows = jnp.where(row_valid, start_ref[tile] + offsets, 0)  # [BM]
  if order_ref is not None:
    assignment = plgpu.load(order_ref.at[sorted_rows], mask=row_valid, other=0)  # [BM]
  source = assignment // addressing.gather_top_k if addressing.gather_top_k else sorted_rows
  target = assignment if addressing.scatter else sorted_rows
  rows = jnp.where(row_valid, source, x_ref.shape[0])[:, None]  # [BM, 1] OOB if not
  out_rows = jnp.where(row_valid, target, out_refs[0].shape[-2])[:, None]  # [BM, 1]
  cols = col_block * bn + jnp.arange(bn, dtype=jnp.int32)[None, :]  # [1, BN]
  out_mask = jnp.broadcast_to(row_valid[:, None], (bm, bn))  # [BM, BN]

  def store(out_ref, value):  # value [BM, BN] float32
    if route_w_ref is not None:  # the routing weight, before the one rounding
      value = value * plgpu.load(route_w_ref.at[target], mask=row_valid, other=0.0)[:, None]
    at = out_ref.at[split, out_rows, cols] if partial else out_ref.at[out_rows, cols]
    plgpu.store(at, value.astype(out_ref.dtype), mask=out_mask)

  def row_scale(index):  # the rows' activation scales in column `index` of x_scale: [BM, 1]
    return plgpu.load(
      xs_ref.at[rows, index + jnp.zeros((1, 1), jnp.int32)], mask=row_valid[:, None], other=0
    )

  @pl.when((count > 0) & (group < num_groups))
  def _():
    lanes = jnp.arange(bk, dtype=jnp.int32)[None, :]  # [1, BK]
    x_mask = jnp.broadcast_to(row_valid[:, None], (bm, bk))  # [BM, BK]
    weight_rows = pl.ds(col_block * bn, bn)
    first = split * static.steps * bk
    dims = (((1,), (1,)), ((), ()))  # [BM, BK] . [BN, BK] over K -> [BM, BN]

    def fold(i, accs):
      k = first + i * bk
      x = plgpu.load(x_ref.at[rows, k + lanes], mask=x_mask)  # [BM, BK] e4m3, masked rows unset
      products = [
        jax.lax.dot_general(
          x, w_ref[group, weight_rows, pl.ds(k, bk)], dims, preferred_element_type=jnp.float32
        )  # [BM, BN]
        for w_ref in w_refs
      ]
      if static.blocks:  # this slice's scales: the rows' group k // 128, the weights' block
        kb = k // BLOCK
        x_scale = row_scale(kb)  # [BM, 1]
        products = [
          p * (x_scale * ws_ref[group, (col_block * bn) // BLOCK, kb])
          for p, ws_ref in zip(products, ws_refs, strict=True)
        ]
      return tuple(acc + p for acc, p in zip(accs, products, strict=True))

    zeros = tuple(jnp.zeros((bm, bn), jnp.float32) for _ in w_refs)
    accs = jax.lax.fori_loop(0, static.steps, fold, zeros)  # [BM, BN] each
    if not static.blocks:  # per channel: both scales once, on the float32 sums
      x_scale = row_scale(0)  # [BM, 1]
      accs = tuple(
        acc * x_scale * ws_ref[group, weight_rows][None, :]
        for acc, ws_ref in zip(accs, ws_refs, strict=True)
      )
    store_results(out_refs, accs, partial, store)

  @pl.when((count > 0) & (group == num_groups))
  def _():
    for out_ref in out_refs:
      store(out_ref, jnp.zeros((bm, bn), jnp.float32))


@functools.partial(
  jax.jit, static_argnames=("num_rows", "tiling", "addressing", "out_dtype", "interpret")
)
def fp8_call(
  tile_args,
  order,
  route_w,
  xq,
  x_scale,
  weights,
  scales,
  *,
  num_rows: int,
  tiling: Tiling,
  addressing: Addressing,
  out_dtype,
  interpret: bool,
):
  """The kernel over M = num_rows sorted rows of the e4m3 rows xq [M or T, K] and their scales
  (order int32[M] and route_w float32[M] as the addressing needs them, else None) -> [M, N] in
  out_dtype, split K's partials added (and weighted, scattered) in an XLA epilogue."""
  k, (n, splits) = xq.shape[1], (weights[0].shape[1], tiling.num_splits)
  tiling = fit_stages(tiling, tiling.block_k * (tiling.block_m + tiling.block_n * len(weights)))
  blocks = scales[0].ndim == 3
  static = _Static(tiling, len(weights), k // (tiling.block_k * splits), blocks, addressing)
  routing = (order, route_w)[: addressing.num_refs(splits > 1)]
  if splits > 1:
    out_shape = [jax.ShapeDtypeStruct((splits, num_rows, n), jnp.float32) for _ in weights]
  else:
    out_shape = [jax.ShapeDtypeStruct((num_rows, n), out_dtype)]
  outs = pl.pallas_call(
    functools.partial(_kernel, static=static),
    grid=(n // tiling.block_n, tile_args[0].shape[0], splits),
    in_specs=[pl.no_block_spec] * (5 + len(routing) + 2 * len(weights)),
    out_specs=[pl.no_block_spec] * len(out_shape),
    out_shape=out_shape,
    compiler_params=triton_compiler_params(tiling.num_warps, tiling.num_stages),
    interpret=interpret,
    name="grouped_matmul_fp8",
  )(*tile_args, *routing, xq, x_scale, *weights, *scales)
  if splits == 1:
    return outs[0]  # [M, N]
  sums = [functools.reduce(jnp.add, [p[s] for s in range(splits)]) for p in outs]  # [M, N] f32
  out = silu(sums[0]) * sums[1] if len(sums) == 2 else sums[0]
  if addressing.scatter:
    out = out * route_w[:, None]  # [M, N] in assignment order
  return out.astype(out_dtype)  # [M, N]
