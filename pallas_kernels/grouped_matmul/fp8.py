"""W8A8 fp8 grouped matmul for GPUs: out [M, N] = rows [M, K] (sorted by group) times each
group's float8_e4m3fn weights, both operands fp8 on the tensor cores, float32 accumulation, the
scales applied to the float32 sums. The bfloat16 kernel's design (gpu.py: row tiles from
tiles.py, grid (N / block_n, num_tiles, num_splits), zeros past the groups, split-K partials
added by an XLA epilogue, the gated SwiGLU with two accumulators rounded once) with fp8 operands.

Weights are stored [G, N, K] = [experts, out, in] (Hugging Face's Linear layout stacked, K
contiguous: the fp8 tensor cores take both operands K-major, and a checkpoint's fp8 experts load
without a transpose), with float32 scales in one of two kinds, told apart by their shape:

  per channel   w_scale [G, N]                   weight[g, n, k] = q * w_scale[g, n]
                activations: one scale per row (per token, over all of K), as the dense W8A8
                path (jaxserve/quantization/quantize.py: quantize_rows)
  128 x 128     w_scale [G, N / 128, K / 128]    weight[g, n, k] = q * w_scale[g, n//128, k//128]
                activations: one scale per row and group of 128 values of K (1 x 128), as
                DeepSeek-V3 / Qwen3-FP8 run their block-wise checkpoints

Activations are quantized dynamically in the wrapper (`quantize_rows`, a few XLA ops on [M, K]
before the kernel; the weights are the large read): a scale is the group's largest magnitude
times 1 / 448 (1 for a group of zeros), the values times its reciprocal clipped to +-448 and
rounded to e4m3, bitwise as jaxserve/quantization/quantize.py computes per-token scales.

In the kernel, program (j, i, s) of a group's tile walks its K slices [k, k + block_k): the fp8
rows [BM, BK] (masked rows 0) dotted with the weights' tile [BN, BK] over K (float32). Per
channel the sum is multiplied once at the end by the rows' scales [BM, 1] and the columns'
[1, BN]; with blocks each slice's product is multiplied by its row scales x_scale[:, k // 128]
and its block's weight scale (one value: block_n and block_k divide 128) before it is added.

`fp8_call` takes gpu.py's Addressing: fp8_routed.py gathers a MoE's tokens into the gate/up
product and scatters the down product's rows to their assignments with it.

Sizes: K and N multiples of 16 (128 for block scales), the blocks powers of two (tiles.py), and
with block scales block_n and block_k dividing 128. The pure-jnp reference is
reference.grouped_matmul_fp8_reference; off GPUs `interpret=True` runs this kernel in Pallas
interpret mode (XLA:CPU computes the e4m3 dots exactly: each product of two e4m3 values is exact
in float32).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.grouped_matmul.gpu import SORTED, Addressing, silu, store_results
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
  "BLOCK",
  "FP8_MAX",
  "Tiling",
  "check_fp8_operands",
  "fp8_call",
  "fp8_tiling",
  "grouped_matmul_fp8",
  "grouped_swiglu_fp8",
  "quantize_rows",
  "scale_group",
]

FP8 = jnp.dtype(jnp.float8_e4m3fn)
FP8_MAX = 448.0  # e4m3's largest finite magnitude
BLOCK = 128  # block scales: 128 x 128 weight blocks, 1 x 128 activation groups
ROW_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def scale_group(w_scale_ndim: int, k: int) -> int:
  """Values of K per activation scale: all of K per channel (w_scale [G, N]), else BLOCK."""
  return k if w_scale_ndim == 2 else BLOCK


def quantize_rows(rows: jax.Array, group: int) -> tuple[jax.Array, jax.Array]:
  """rows [M, K] -> (e4m3 [M, K], float32 scales [M, K / group]): per row and `group` values of
  K, scale = largest magnitude * (1 / 448) (1 for zeros), values * (1 / scale) clipped, rounded."""
  m, k = rows.shape
  x = rows.astype(jnp.float32).reshape(m, k // group, group)  # [M, KS, group]
  amax = jnp.max(jnp.abs(x), axis=-1)  # [M, KS]
  scale = jnp.where(amax > 0, amax * jnp.float32(1.0 / FP8_MAX), 1.0).astype(jnp.float32)
  q = jnp.clip(x * (1.0 / scale)[..., None], -FP8_MAX, FP8_MAX).astype(FP8)  # [M, KS, group]
  return q.reshape(m, k), scale


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


@functools.partial(jax.jit, static_argnames=("tiling", "interpret"))
def _grouped(rows, group_sizes, weights, scales, *, tiling: Tiling, interpret: bool):
  (m, k), g = rows.shape, weights[0].shape[0]
  xq, x_scale = quantize_rows(rows, scale_group(scales[0].ndim, k))  # [M, K], [M, KS]
  tiles = num_tiles(m, g, tiling.block_m)
  return fp8_call(
    tile_map(group_sizes, m, tiling.block_m, tiles),  # 3 x int32[tiles]
    None,
    None,
    xq,
    x_scale,
    weights,
    scales,
    num_rows=m,
    tiling=tiling,
    addressing=SORTED,
    out_dtype=rows.dtype,
    interpret=interpret,
  )


def fp8_tiling(m: int, k: int, n: int, num_groups: int, gated: bool = False) -> Tiling:
  """tiles.default_tiling with K walked 128 at a time where K allows (128 e4m3 values are the
  bytes of 64 bfloat16 ones, the bfloat16 kernel's prefill step), so block scales' 128 x 128
  blocks hold whole slices."""
  t = default_tiling(m, k, n, num_groups, gated)
  if t.block_k < BLOCK and k % (BLOCK * t.num_splits) == 0:
    t = Tiling(t.block_m, t.block_n, BLOCK, t.num_splits, t.num_warps, t.num_stages)
  return t


def check_fp8_operands(
  name: str, rows, weights, scales, group_sizes, tiling: Tiling | None, num_rows: int | None = None
) -> Tiling:
  """ValueError naming the first array whose shape or dtype does not fit; the tiling to run over
  num_rows sorted rows (default: the rows')."""
  if rows.ndim != 2 or rows.dtype not in ROW_DTYPES:
    raise ValueError(
      f"{name}: rows: expected [M, K] bfloat16, float16 or float32, got "
      f"{rows.dtype}{list(rows.shape)}"
    )
  (m, k), w0 = rows.shape, weights[0]
  m = m if num_rows is None else num_rows
  for w in weights:
    if w.ndim != 3 or w.shape[2] != k or w.shape != w0.shape or w.dtype != FP8:
      raise ValueError(
        f"{name}: weights: expected float8_e4m3fn[G, N, {k}] (all alike), "
        f"got {[f'{x.dtype}{list(x.shape)}' for x in weights]}"
      )
  g, n = w0.shape[0], w0.shape[1]
  kinds = ((g, n), (g, n // BLOCK, k // BLOCK))
  for s in scales:
    blocks = s.ndim == 3 and n % BLOCK == 0 and k % BLOCK == 0
    if (
      s.dtype != jnp.float32
      or s.shape not in kinds[: 2 if blocks else 1]
      or s.ndim != scales[0].ndim
    ):
      raise ValueError(
        f"{name}: w_scale: expected float32[{g}, {n}] (per channel) or float32[{g}, N / 128, "
        f"K / 128] (N and K multiples of 128), all alike, got "
        f"{[f'{x.dtype}{list(x.shape)}' for x in scales]}"
      )
  if group_sizes.shape != (g,) or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise ValueError(
      f"{name}: group_sizes: expected int[{g}], got {group_sizes.dtype}{list(group_sizes.shape)}"
    )
  if not supports(m, k, n, g):
    raise ValueError(
      f"{name}: weights: K and N must be multiples of 16 and every array under 2**31 "
      f"elements, got rows {list(rows.shape)}, weights {list(w0.shape)}"
    )
  tiling = tiling or fp8_tiling(m, k, n, g, gated=len(weights) == 2)
  check_tiling(tiling, k, n, name)
  if scales[0].ndim == 3 and (BLOCK % tiling.block_n or BLOCK % tiling.block_k):
    raise ValueError(
      f"{name}: tiling: block scales need block_n and block_k dividing 128, got {tiling}"
    )
  return tiling


def grouped_matmul_fp8(
  rows: jax.Array,  # [M, K] sorted by group: bfloat16, float16 or float32 (quantized here)
  weights: jax.Array,  # float8_e4m3fn [G, N, K]: each group's [out, in]
  w_scale: jax.Array,  # float32 [G, N] (per channel) or [G, N / 128, K / 128] (128 x 128 blocks)
  group_sizes: jax.Array,  # int[G]: group g owns the group_sizes[g] rows after groups < g
  *,
  tiling: Tiling | None = None,
  interpret: bool = False,
) -> jax.Array:
  """-> [M, N] in rows' dtype: each row of a group, quantized to e4m3 (per row, or per row and
  128 of K with block scales), times that group's dequantized weights transposed, float32
  accumulation; rows past sum(group_sizes) are zero. tiling: default fp8_tiling."""
  tiling = check_fp8_operands(
    "grouped_matmul_fp8", rows, (weights,), (w_scale,), group_sizes, tiling
  )
  if rows.shape[0] == 0:
    return jnp.zeros((0, weights.shape[1]), rows.dtype)
  return _grouped(rows, group_sizes, (weights,), (w_scale,), tiling=tiling, interpret=interpret)


def grouped_swiglu_fp8(
  rows: jax.Array,  # [M, K] sorted by group: bfloat16, float16 or float32 (quantized here)
  gate: jax.Array,  # float8_e4m3fn [G, N, K]
  gate_scale: jax.Array,  # float32 [G, N] or [G, N / 128, K / 128], as grouped_matmul_fp8's
  up: jax.Array,  # like gate
  up_scale: jax.Array,  # like gate_scale
  group_sizes: jax.Array,  # int[G]
  *,
  tiling: Tiling | None = None,
  interpret: bool = False,
) -> jax.Array:
  """-> silu(rows @ gate.T) * (rows @ up.T) [M, N] in rows' dtype, each product as
  grouped_matmul_fp8's (the rows quantized once), in float32, rounded once; zero past the
  groups."""
  tiling = check_fp8_operands(
    "grouped_swiglu_fp8", rows, (gate, up), (gate_scale, up_scale), group_sizes, tiling
  )
  if rows.shape[0] == 0:
    return jnp.zeros((0, gate.shape[1]), rows.dtype)
  return _grouped(
    rows, group_sizes, (gate, up), (gate_scale, up_scale), tiling=tiling, interpret=interpret
  )
