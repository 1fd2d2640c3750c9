"""Quantized matmul for few rows on GPUs: y [M, N] = x [M, K] @ (w [N, K] * scale
[N, None]).T, one Pallas (Triton) kernel that reads the 8-bit weight (int8 or float8_e4m3fn) and
converts each tile to x's dtype in registers, so no dequantized copy of the weight is ever
written (the point: a decode step reads each weight once, at 8 bits). With quantize_x (float8
weights only) the kernel computes W8A8 instead: x is quantized to float8_e4m3fn in registers, one
scale per row and group of X_GROUP values of K, and the dot runs on fp8 operands, so no weight
tile is converted at all.

A decode step multiplies a handful of rows by every weight, so it is bound by reading the
weights; the W8A8 alternative (XLA's cuBLASLt fp8 GEMM) pays, per projection, a per-token
quantization of x (a reduction and a convert), padding of M to 16 and a scale epilogue, each a
kernel of its own. Here all of it is one kernel, plus a split-K epilogue when num_splits > 1.

Grid: (N / block_n, num_splits). Program (j, s) owns output columns [j * block_n, (j + 1) *
block_n) and the s-th of num_splits equal runs of K, walked in block_k slices: the x slice [BM,
BK] (rows past M masked to 0; BM = 16, the smallest tensor-core tile), the weight tile [BN, BK]
converted to x's dtype, one dot with float32 accumulation. The per-channel scale multiplies the
float32 sum. With one split the program rounds to x's dtype and stores y; with several it stores
float32 partials [S, M, N] that a small XLA epilogue adds in split order and rounds.

quantize_x: the K loop walks blocks of X_GROUP (block_k must equal it). Per block, each row's
scale is its largest magnitude over 448 (e4m3's largest), the block x / scale rounds to e4m3
(nearest, ties to even), and the dot runs with the weight tile as its left operand: w [BN, BK]
times xq [BM, BK] contracted over K gives [BN, BM] (the many weight rows fill the tensor cores'
large M side, the few tokens the small N side, as CUTLASS's swapped operands for small M). The
float32 block sum times the row's scale is added to the accumulator, which is transposed before
the store. Scales per block of 128 follow the activations more closely than one per token (the
XLA path's), so the two W8A8 paths differ in rounding; reference.quantized_matmul_fp8x_reference
is this arithmetic in jnp.

Tiling.fp8_bits converts float8_e4m3fn tiles to bfloat16 with integer operations instead of
Triton's conversion: the byte's sign moves to bit 15 and its 4 exponent and 3 mantissa bits to
bits 7-13, which is the bfloat16 of the same value times 2**-120 (e4m3's exponent bias is 7,
bfloat16's 127), and the scale carries the 2**120 back. Every product is then the same product
times a power of two, so the sums equal the cast's to rounding. e4m3's subnormals (|w| < 2**-6
before the scale) become bfloat16 subnormals: a GPU's tensor cores read them; a platform that
flushes subnormals (XLA's CPU, in interpret mode) reads them as 0.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.ragged_paged_attention.gpu_write import triton_compiler_params

BLOCK_M = 16  # rows per program: all of x (M <= MAX_ROWS), the tensor cores' smallest tile
MAX_ROWS = BLOCK_M
X_GROUP = 128  # quantize_x: values of K per activation scale
FP8_MAX = 448.0  # float8_e4m3fn's largest finite magnitude
MIN_X_SCALE = 2.0**-120  # quantize_x: smaller activation scales (1 / scale past float32) -> 0
QUANTIZE_X_BLOCK_N = 128
WEIGHT_DTYPES = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))
TARGET_PROGRAMS = 264  # two waves of an H100's 132 SMs: enough loads in flight
MAX_SPLITS = 8


@dataclass(frozen=True)
class Tiling:
  """block_n output columns and block_k of K per loop step (powers of two >= 16), K split into
  num_splits runs; num_warps and num_stages are Triton's."""

  block_n: int = 32
  block_k: int = 256
  num_splits: int = 1
  num_warps: int = 4
  num_stages: int = 3
  fp8_bits: bool = False  # float8_e4m3fn weights: convert by bit operations (module docstring)


def _largest_pow2_divisor(n: int, cap: int) -> int:
  block = cap
  while block > 16 and n % block:
    block //= 2
  return block


def default_tiling(
  n: int, k: int, block_n: int | None = None, block_k: int = 256, *, quantize_x: bool = False
) -> Tiling:
  """The tiling for a [N, K] weight: the largest block_n / block_k (up to the given) dividing N /
  K, and the fewest splits (a power of two, at most MAX_SPLITS) that give TARGET_PROGRAMS
  programs. A weight wide enough to need no split walks K in halved blocks (block_k / 2, at
  least 16). The rule and the defaults (block_n 32) follow the tiling sweep on an H100
  (docs/PERFORMANCE.md). quantize_x: blocks of K are X_GROUP, block_n by default
  QUANTIZE_X_BLOCK_N (the fp8 dot's left operand: more weight rows per program, the sweep on an
  H200)."""
  if quantize_x:
    block_n, block_k = block_n or QUANTIZE_X_BLOCK_N, X_GROUP
  block_n = block_n or 32
  block_n = _largest_pow2_divisor(n, block_n)
  block_k = _largest_pow2_divisor(k, block_k)
  if n // block_n >= TARGET_PROGRAMS and block_k > 16 and not quantize_x:
    block_k //= 2
  splits = 1
  while (
    (n // block_n) * splits < TARGET_PROGRAMS
    and splits < MAX_SPLITS
    and k % (block_k * splits * 2) == 0
  ):
    splits *= 2
  return Tiling(block_n, block_k, splits)


def supports(m: int, n: int, k: int, quantize_x: bool = False) -> bool:
  """Whether the kernel takes these sizes: 1 <= M <= MAX_ROWS, N and K multiples of 16 (K of
  X_GROUP with quantize_x)."""
  k_unit = X_GROUP if quantize_x else 16
  return 1 <= m <= MAX_ROWS and n % 16 == 0 and k % k_unit == 0 and n > 0 and k > 0


FP8_BITS_SCALE = 2.0**120  # bfloat16's exponent bias (127) less float8_e4m3fn's (7)


def _fp8_bits_to_bfloat16(w: jax.Array) -> jax.Array:
  """float8_e4m3fn [BN, BK] -> bfloat16 of the same values times 2**-120, by bit operations."""
  b = jax.lax.bitcast_convert_type(w, jnp.uint8).astype(jnp.uint16)  # [BN, BK]
  bits = ((b & 0x80) << 8) | ((b & 0x7F) << 4)  # sign to bit 15, exponent and mantissa below it
  return jax.lax.bitcast_convert_type(bits, jnp.bfloat16)  # [BN, BK]


def _quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """x [BM, BK] -> (x / scale rounded to float8_e4m3fn [BM, BK], scale float32[BM]): one scale
  per row, its largest magnitude over FP8_MAX; a row whose scale is below MIN_X_SCALE (zeros, or
  values so small that 1 / scale would overflow float32) quantizes to zeros."""
  x = x.astype(jnp.float32)  # [BM, BK]
  scale = jnp.max(jnp.abs(x), axis=1) / FP8_MAX  # [BM]
  inverse = jnp.where(scale >= MIN_X_SCALE, 1.0 / jnp.maximum(scale, MIN_X_SCALE), 0.0)  # [BM]
  xq = jnp.clip(x * inverse[:, None], -FP8_MAX, FP8_MAX)  # [BM, BK]
  return xq.astype(jnp.float8_e4m3fn), scale


def _kernel(
  x_ref,
  w_ref,
  scale_ref,
  o_ref,
  *,
  num_rows,
  block_n,
  block_k,
  steps_per_split,
  partial,
  fp8_bits,
  quantize_x,
):
  col_block, split = pl.program_id(0), pl.program_id(1)
  rows = jnp.arange(BLOCK_M, dtype=jnp.int32)  # [BM]
  row_mask = (rows < num_rows)[:, None]  # [BM, 1]
  rows = jnp.where(rows < num_rows, rows, num_rows)[:, None]  # [BM, 1], out of bounds if masked
  cols = pl.ds(col_block * block_n, block_n)
  lanes = jnp.arange(block_k, dtype=jnp.int32)[None, :]  # [1, BK]
  first = split * steps_per_split * block_k

  dims = (((1,), (1,)), ((), ()))

  def fold(i, acc):
    k = first + i * block_k
    x = plgpu.load(
      x_ref.at[rows, k + lanes], mask=jnp.broadcast_to(row_mask, (BLOCK_M, block_k)), other=0
    )  # [BM, BK]
    w = w_ref[cols, pl.ds(k, block_k)]  # [BN, BK] 8-bit
    if quantize_x:
      xq, x_scale = _quantize_rows(x)  # [BM, BK] float8_e4m3fn, [BM]
      block = jax.lax.dot_general(w, xq, dims, preferred_element_type=jnp.float32)  # [BN, BM]
      return acc + block * x_scale[None, :]
    w = (_fp8_bits_to_bfloat16(w) if fp8_bits else w).astype(x.dtype)  # [BN, BK]
    return acc + jax.lax.dot_general(x, w, dims, preferred_element_type=jnp.float32)  # [BM, BN]

  acc_shape = (block_n, BLOCK_M) if quantize_x else (BLOCK_M, block_n)
  acc = jax.lax.fori_loop(0, steps_per_split, fold, jnp.zeros(acc_shape, jnp.float32))
  acc = acc.T if quantize_x else acc  # [BM, BN]
  scale = scale_ref[cols] * FP8_BITS_SCALE if fp8_bits else scale_ref[cols]  # [BN]
  acc = acc * scale[None, :]
  out_cols = col_block * block_n + jnp.arange(block_n, dtype=jnp.int32)[None, :]  # [1, BN]
  mask = jnp.broadcast_to(row_mask, (BLOCK_M, block_n))
  target = o_ref.at[split, rows, out_cols] if partial else o_ref.at[rows, out_cols]
  plgpu.store(target, acc.astype(o_ref.dtype), mask=mask)


@functools.partial(jax.jit, static_argnames=("tiling", "quantize_x", "interpret"))
def _quantized_matmul(x, w, scale, *, tiling: Tiling, quantize_x: bool, interpret: bool):
  (m, k), n = x.shape, w.shape[0]
  splits = tiling.num_splits
  partial = splits > 1
  kernel = functools.partial(
    _kernel,
    num_rows=m,
    block_n=tiling.block_n,
    block_k=tiling.block_k,
    steps_per_split=k // (tiling.block_k * splits),
    partial=partial,
    fp8_bits=tiling.fp8_bits and w.dtype == jnp.float8_e4m3fn and not quantize_x,
    quantize_x=quantize_x,
  )
  out_shape = (splits, m, n) if partial else (m, n)
  y = pl.pallas_call(
    kernel,
    grid=(n // tiling.block_n, splits),
    in_specs=[pl.no_block_spec] * 3,
    out_specs=pl.no_block_spec,
    out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32 if partial else x.dtype),
    compiler_params=triton_compiler_params(tiling.num_warps, tiling.num_stages),
    interpret=interpret,
    name="quantized_matmul",
  )(x, w, scale)
  if not partial:
    return y  # [M, N]
  return functools.reduce(jnp.add, [y[s] for s in range(splits)]).astype(x.dtype)  # [M, N]


def quantized_matmul(
  x: jax.Array,  # [M, K] bfloat16 or float32, 1 <= M <= 16
  w: jax.Array,  # [N, K] int8 or float8_e4m3fn: the kernel, [out, in]
  scale: jax.Array,  # float32[N]: one per output channel
  *,
  tiling: Tiling | None = None,
  quantize_x: bool = False,
  interpret: bool = False,
) -> jax.Array:
  """x @ (w * scale[:, None]).T -> [M, N] in x's dtype (float32 accumulation). tiling: default
  default_tiling(N, K, quantize_x=quantize_x); N must be a multiple of block_n and K of block_k *
  num_splits. quantize_x (float8_e4m3fn w only, block_k X_GROUP): x quantized to e4m3 per row and
  X_GROUP of K, the dot on fp8 operands (the module docstring)."""
  _check_arrays(x, w, scale)
  if quantize_x and w.dtype != jnp.float8_e4m3fn:
    raise ValueError(f"quantized_matmul: w: quantize_x needs float8_e4m3fn, got {w.dtype}")
  if not supports(*x.shape[:1], *w.shape, quantize_x):
    unit = X_GROUP if quantize_x else 16
    raise ValueError(
      f"quantized_matmul: w: N must be a multiple of 16 and K of {unit}, got {w.shape}"
    )
  tiling = tiling or default_tiling(*w.shape, quantize_x=quantize_x)
  _check_tiling(tiling, w.shape, quantize_x)
  return _quantized_matmul(x, w, scale, tiling=tiling, quantize_x=quantize_x, interpret=interpret)


def _check_arrays(x: jax.Array, w: jax.Array, scale: jax.Array) -> None:
  if x.ndim != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
    raise ValueError(
      f"quantized_matmul: x: expected [M, K] with 1 <= M <= {MAX_ROWS}, got {x.shape}"
    )
  if x.dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)):
    raise ValueError(f"quantized_matmul: x: expected bfloat16 or float32, got {x.dtype}")
  if w.ndim != 2 or w.shape[1] != x.shape[1] or w.dtype not in WEIGHT_DTYPES:
    raise ValueError(
      f"quantized_matmul: w: expected int8 or float8_e4m3fn [N, {x.shape[1]}], "
      f"got {w.dtype}{list(w.shape)}"
    )
  if scale.shape != (w.shape[0],) or scale.dtype != jnp.float32:
    raise ValueError(
      f"quantized_matmul: scale: expected float32[{w.shape[0]}], "
      f"got {scale.dtype}{list(scale.shape)}"
    )


def _check_tiling(tiling: Tiling, w_shape: tuple[int, ...], quantize_x: bool) -> None:
  blocks = (tiling.block_n, tiling.block_k)
  if any(b < 16 or b & (b - 1) for b in blocks) or tiling.num_splits < 1:
    raise ValueError(f"quantized_matmul: tiling: blocks must be powers of two >= 16, got {tiling}")
  if w_shape[0] % tiling.block_n or w_shape[1] % (tiling.block_k * tiling.num_splits):
    raise ValueError(
      f"quantized_matmul: tiling: N {w_shape[0]} must be a multiple of block_n and K "
      f"{w_shape[1]} of block_k * num_splits, got {tiling}"
    )
  if quantize_x and tiling.block_k != X_GROUP:
    raise ValueError(
      f"quantized_matmul: tiling: quantize_x needs block_k {X_GROUP}, got {tiling.block_k}"
    )
