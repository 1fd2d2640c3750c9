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

`fp8_call` (fp8_kernel.py, with the kernel's body) takes gpu.py's Addressing: fp8_routed.py
gathers a MoE's tokens into the gate/up product and scatters the down product's rows to their
assignments with it.

Sizes: K and N multiples of 16 (128 for block scales), the blocks powers of two (tiles.py), and
with block scales block_n and block_k dividing 128. The pure-jnp reference is
reference.grouped_matmul_fp8_reference; off GPUs `interpret=True` runs this kernel in Pallas
interpret mode (XLA:CPU computes the e4m3 dots exactly: each product of two e4m3 values is exact
in float32).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.grouped_matmul.fp8_kernel import BLOCK, fp8_call
from pallas_kernels.grouped_matmul.gpu import SORTED
from pallas_kernels.grouped_matmul.tiles import (
  Tiling,
  check_tiling,
  default_tiling,
  num_tiles,
  supports,
  tile_map,
)

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
