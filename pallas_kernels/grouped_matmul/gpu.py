"""Grouped matmul for GPUs: out [M, N] = rows [M, K] (sorted by group) @ weights[g] [K, N] for
the rows of each group g, as one Pallas (Triton) kernel over row tiles, so each program reads
only its own group's weights (XLA's GPU ragged_dot materializes every group's product).

The wrapper maps the groups' runs of rows to row tiles (tiles.py: tile_map, a few XLA ops on
group_sizes, fixed shapes), then the kernel's grid is (N / block_n, num_tiles, num_splits),
column blocks fastest so the programs launched together share their rows in L2. Program (j, i, s)
loads its tile's group, first row and row count as scalars and

  * a tile of a group: walks the s-th of num_splits equal runs of K in block_k slices: the rows'
    slice [BM, BK] (rows past the count masked to 0; a tile's rows are consecutive), the
    weights' slice [BK, BN] of its group, one dot with float32 accumulation; stores its rows
    of column block j, masked to the count, rounded to the rows' dtype;
  * a tile of the tail (rows past sum(group_sizes)): stores zeros;
  * an unused tile (0 rows): nothing.

Every output row is stored by exactly one tile per column block, so the output is fully
written, with zeros past the groups. With num_splits > 1 the programs store float32 partials
[S, M, N] that a small XLA epilogue adds in split order and rounds.

Gated (`grouped_swiglu`): each program multiplies its rows by two weights, gate and up, with two
accumulators, and stores silu(gate product) * up product, rounded once (split: two partials,
the SwiGLU in the epilogue). A MoE layer's gate and up projections are one kernel that reads the
rows once and writes [M, N] once.

Addressing (`Addressing`, routed.py's): a MoE layer's products can take their rows from the
tokens and put their outputs at the assignments, given the routing's order [M] (routing.py):
gathered, program row r loads token order[r] // top_k of x [T, K]; scattered, it stores row
order[r] times that assignment's routing weight (float32, before the rounding); and the down
product can load a split gate/up product's float32 partials, adding and gating them as it loads
(no epilogue between the two). These change where a row is loaded from and stored to, not the
loop over K.

Sizes are static per (M, K, N, G): a step compiles once per token bucket. K and N must be
multiples of 16 and of the blocks (tiles.check_tiling); offsets are int32 (tiles.supports).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.grouped_matmul.tiles import (
  Tiling,
  check_tiling,
  default_tiling,
  fit_stages,
  num_tiles,
  supports,
  tile_map,
)
from pallas_kernels.triton_params import triton_compiler_params

__all__ = [
  "Addressing",
  "Tiling",
  "check_operands",
  "default_tiling",
  "grouped_call",
  "grouped_matmul",
  "grouped_swiglu",
  "supports",
]

DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def silu(x: jax.Array) -> jax.Array:
  return x / (1.0 + jnp.exp(-x))


def store_results(out_refs, accs, partial: bool, store) -> None:
  """A program's float32 sums [BM, BN] each, stored by `store`: every sum (split K's partials),
  else silu(gate) * up of a gated product, else the one product."""
  if partial:
    for out_ref, acc in zip(out_refs, accs, strict=True):
      store(out_ref, acc)
  elif len(accs) == 2:
    store(out_refs[0], silu(accs[0]) * accs[1])
  else:
    store(out_refs[0], accs[0])


def _kernel(
  tile_group_ref,
  tile_start_ref,
  tile_rows_ref,
  *refs,
  tiling: Tiling,
  num_weights: int,
  steps: int,
  addressing: Addressing,
):
  """refs: the order [M] (gathered or scattered rows) and the routing weights [M] (scattered),
  the rows [M or T, K] (or a gated product's two float32 partials [S', M, K]), the weights
  [G, K, N] (one, or gate and up), then the output [M, N] or the float32 partials [S, M, N]
  (one per weight)."""
  num_routing = addressing.num_refs(tiling.num_splits > 1)
  order_ref, route_w_ref = (refs[:num_routing] + (None, None))[:2]
  num_row_refs = 2 if addressing.swiglu_partials else 1
  x_refs = refs[num_routing : num_routing + num_row_refs]
  x_ref, refs = x_refs[0], refs[num_routing + num_row_refs :]
  w_refs, out_refs = refs[:num_weights], refs[num_weights:]
  bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
  num_groups = w_refs[0].shape[0]
  col_block, tile, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  group = tile_group_ref[tile]
  count = tile_rows_ref[tile]
  offsets = jnp.arange(bm, dtype=jnp.int32)  # [BM]
  row_valid = offsets < count  # [BM]
  sorted_rows = jnp.where(row_valid, tile_start_ref[tile] + offsets, 0)  # [BM]
  if order_ref is not None:
    assignment = plgpu.load(order_ref.at[sorted_rows], mask=row_valid, other=0)  # [BM]
  source = assignment // addressing.gather_top_k if addressing.gather_top_k else sorted_rows
  target = assignment if addressing.scatter else sorted_rows
  rows = jnp.where(row_valid, source, x_ref.shape[-2])[:, None]  # [BM, 1] OOB when masked
  num_out = out_refs[0].shape[-2]
  out_rows = jnp.where(row_valid, target, num_out)[:, None]  # [BM, 1]
  cols = col_block * bn + jnp.arange(bn, dtype=jnp.int32)[None, :]  # [1, BN]
  out_mask = jnp.broadcast_to(row_valid[:, None], (bm, bn))  # [BM, BN]
  partial = tiling.num_splits > 1

  def store(out_ref, value):  # value [BM, BN] float32
    if route_w_ref is not None:  # the routing weight, before the one rounding
      value = value * plgpu.load(route_w_ref.at[target], mask=row_valid, other=0.0)[:, None]
    at = out_ref.at[split, out_rows, cols] if partial else out_ref.at[out_rows, cols]
    plgpu.store(at, value.astype(out_ref.dtype), mask=out_mask)

  @pl.when((count > 0) & (group < num_groups))
  def _():
    lanes = jnp.arange(bk, dtype=jnp.int32)[None, :]  # [1, BK]
    x_mask = jnp.broadcast_to(row_valid[:, None], (bm, bk))  # [BM, BK]
    weight_cols = pl.ds(col_block * bn, bn)
    first = split * steps * bk
    precision = jax.lax.Precision.HIGHEST if w_refs[0].dtype == jnp.float32 else None
    dims = (((1,), (0,)), ((), ()))

    def load_rows(k):  # [BM, BK] in the weights' dtype
      if not addressing.swiglu_partials:
        return plgpu.load(x_ref.at[rows, k + lanes], mask=x_mask, other=0)
      g, u = (
        functools.reduce(
          jnp.add,
          [plgpu.load(r.at[s, rows, k + lanes], mask=x_mask, other=0.0) for s in range(r.shape[0])],
        )
        for r in x_refs
      )  # the partials added in split order, as the epilogue of grouped_call
      return (silu(g) * u).astype(w_refs[0].dtype)

    def fold(i, accs):
      k = first + i * bk
      x = load_rows(k)  # [BM, BK]
      return tuple(
        acc
        + jax.lax.dot_general(
          x,
          w_ref[group, pl.ds(k, bk), weight_cols],  # [BK, BN]
          dims,
          precision=precision,
          preferred_element_type=jnp.float32,
        )  # [BM, BN]
        for acc, w_ref in zip(accs, w_refs, strict=True)
      )

    zeros = tuple(jnp.zeros((bm, bn), jnp.float32) for _ in w_refs)
    accs = jax.lax.fori_loop(0, steps, fold, zeros)  # [BM, BN] each
    store_results(out_refs, accs, partial, store)

  @pl.when((count > 0) & (group == num_groups))
  def _():
    for out_ref in out_refs:
      store(out_ref, jnp.zeros((bm, bn), jnp.float32))


@dataclass(frozen=True)
class Addressing:
  """Where a program's rows come from and go to. gather_top_k > 0: sorted row r reads row
  order[r] // gather_top_k of the rows [T, K] (a token of its assignment); scatter: it writes
  row order[r] of the output (its assignment), times the routing weight route_w[order[r]]
  (float32, before the one rounding; in the epilogue when K is split). Neither: rows [M, K]
  already sorted, written in place. swiglu_partials: the rows are a gated product's float32
  partials (gate's and up's [S', M, K], sorted), added and gated as they are loaded, so a split
  gate/up product needs no epilogue of its own."""

  gather_top_k: int = 0
  scatter: bool = False
  swiglu_partials: bool = False

  def num_refs(self, partial: bool) -> int:
    """The routing operands before the rows: the order, then the routing weights."""
    uses_order = self.gather_top_k > 0 or self.scatter
    return int(uses_order) + int(self.scatter and not partial)


SORTED = Addressing()


@functools.partial(
  jax.jit, static_argnames=("num_rows", "tiling", "addressing", "interpret", "partials")
)
def grouped_call(
  tile_args,
  order,
  route_w,
  rows,
  *weights,
  num_rows,
  tiling: Tiling,
  addressing,
  interpret,
  partials: bool = False,
):
  """The kernel over M = num_rows sorted rows (order int32[M] and route_w float32[M] as the
  addressing needs them, else None; rows a tuple of two partials with swiglu_partials) -> [M, N]
  in the weights' dtype, the epilogue of split K added; with `partials` and split K, the float32
  partials [S, M, N] (one per weight) instead."""
  rows = rows if addressing.swiglu_partials else (rows,)
  k, n, dtype = rows[0].shape[-1], weights[0].shape[2], weights[0].dtype
  splits = tiling.num_splits
  routing = (order, route_w)[: addressing.num_refs(splits > 1)]
  row_bytes = sum(r.dtype.itemsize * (r.shape[0] if r.ndim == 3 else 1) for r in rows)
  stage_bytes = tiling.block_k * (
    tiling.block_m * row_bytes + tiling.block_n * sum(w.dtype.itemsize for w in weights)
  )
  tiling = fit_stages(tiling, stage_bytes)
  kernel = functools.partial(
    _kernel,
    tiling=tiling,
    num_weights=len(weights),
    steps=k // (tiling.block_k * splits),
    addressing=addressing,
  )
  if splits > 1:
    out_shape = [jax.ShapeDtypeStruct((splits, num_rows, n), jnp.float32) for _ in weights]
  else:
    out_shape = [jax.ShapeDtypeStruct((num_rows, n), dtype)]
  outs = pl.pallas_call(
    kernel,
    grid=(n // tiling.block_n, tile_args[0].shape[0], splits),
    in_specs=[pl.no_block_spec] * (3 + len(routing) + len(rows) + len(weights)),
    out_specs=[pl.no_block_spec] * len(out_shape),
    out_shape=out_shape,
    compiler_params=triton_compiler_params(tiling.num_warps, tiling.num_stages),
    interpret=interpret,
    name="grouped_matmul",
  )(*tile_args, *routing, *rows, *weights)
  if splits == 1:
    return outs[0]  # [M, N]
  if partials:
    return tuple(outs)  # [S, M, N] float32 each
  sums = [functools.reduce(jnp.add, [p[s] for s in range(splits)]) for p in outs]  # [M, N] f32
  out = silu(sums[0]) * sums[1] if len(sums) == 2 else sums[0]
  if addressing.scatter:
    out = out * route_w[:, None]  # [M, N] in assignment order
  return out.astype(dtype)  # [M, N]


@functools.partial(jax.jit, static_argnames=("tiling", "interpret"))
def _grouped(rows, group_sizes, *weights, tiling: Tiling, interpret: bool):
  m, g = rows.shape[0], weights[0].shape[0]
  tiles = num_tiles(m, g, tiling.block_m)
  tile_args = tile_map(group_sizes, m, tiling.block_m, tiles)  # 3 x int32[tiles]
  return grouped_call(
    tile_args,
    None,
    None,
    rows,
    *weights,
    num_rows=m,
    tiling=tiling,
    addressing=SORTED,
    interpret=interpret,
  )


def check_operands(
  name: str, rows, weights, group_sizes, tiling: Tiling | None, num_rows: int | None = None
) -> Tiling:
  """ValueError naming the first array whose shape or dtype does not fit; the tiling to run
  over num_rows sorted rows (default: the rows')."""
  if rows.ndim != 2 or rows.dtype not in DTYPES:
    raise ValueError(
      f"{name}: rows: expected [M, K] bfloat16, float16 or float32, got "
      f"{rows.dtype}{list(rows.shape)}"
    )
  k, w0 = rows.shape[1], weights[0]
  m = rows.shape[0] if num_rows is None else num_rows
  for w in weights:
    if w.ndim != 3 or w.shape[1] != k or w.shape != w0.shape or w.dtype != rows.dtype:
      raise ValueError(
        f"{name}: weights: expected {rows.dtype}[G, {k}, N] (all alike), "
        f"got {[f'{x.dtype}{list(x.shape)}' for x in weights]}"
      )
  num_groups, n = w0.shape[0], w0.shape[2]
  if group_sizes.shape != (num_groups,) or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise ValueError(
      f"{name}: group_sizes: expected int[{num_groups}], "
      f"got {group_sizes.dtype}{list(group_sizes.shape)}"
    )
  if not supports(m, k, n, num_groups):
    raise ValueError(
      f"{name}: weights: K and N must be multiples of 16 and every array under 2**31 "
      f"elements, got rows {list(rows.shape)}, weights {list(w0.shape)}"
    )
  tiling = tiling or default_tiling(m, k, n, num_groups, gated=len(weights) == 2)
  check_tiling(tiling, k, n, name)
  return tiling


def grouped_matmul(
  rows: jax.Array,  # [M, K] sorted by group: bfloat16, float16 or float32
  weights: jax.Array,  # [G, K, N] in rows' dtype, K and N multiples of 16
  group_sizes: jax.Array,  # int[G]: group g owns the group_sizes[g] rows after groups < g
  *,
  tiling: Tiling | None = None,
  interpret: bool = False,
) -> jax.Array:
  """-> [M, N] in rows' dtype (float32 accumulation): each row of a group times that group's
  weights; rows past sum(group_sizes) are zero. tiling: default tiles.default_tiling."""
  tiling = check_operands("grouped_matmul", rows, (weights,), group_sizes, tiling)
  if rows.shape[0] == 0:
    return jnp.zeros((0, weights.shape[2]), rows.dtype)
  return _grouped(rows, group_sizes, weights, tiling=tiling, interpret=interpret)


def grouped_swiglu(
  rows: jax.Array,  # [M, K] sorted by group: bfloat16, float16 or float32
  gate: jax.Array,  # [G, K, N] in rows' dtype, K and N multiples of 16
  up: jax.Array,  # [G, K, N] like gate
  group_sizes: jax.Array,  # int[G]: group g owns the group_sizes[g] rows after groups < g
  *,
  tiling: Tiling | None = None,
  interpret: bool = False,
) -> jax.Array:
  """-> silu(rows @ gate) * (rows @ up) [M, N] in rows' dtype, per group as grouped_matmul,
  computed in float32 and rounded once; rows past sum(group_sizes) are zero."""
  tiling = check_operands("grouped_swiglu", rows, (gate, up), group_sizes, tiling)
  if rows.shape[0] == 0:
    return jnp.zeros((0, gate.shape[2]), rows.dtype)
  return _grouped(rows, group_sizes, gate, up, tiling=tiling, interpret=interpret)
