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

Grid: (N / block_n, num_splits), or with Tiling.programs P > 0 (P,) persistent programs that
each fold several units in one loop (tiling.py). Unit (j, s) owns output columns [j * block_n,
(j + 1) * block_n) and the s-th of num_splits equal runs of K, walked in block_k slices: the x
slice [BM, BK] (rows past M masked to 0; BM = 16, the smallest tensor-core tile), the weight
tile [BN, BK] converted to x's dtype, one dot with float32 accumulation. The per-channel scale
multiplies the float32 sum. With one split the unit rounds to x's dtype and stores y; with
several it stores float32 partials [S, M, N] that a small XLA epilogue adds in split order and
rounds.

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

from pallas_kernels.quantized_matmul.tiling import (
  BLOCK_M,
  MAX_ROWS,
  MAX_SPLITS,
  TARGET_PROGRAMS,
  WEIGHT_DTYPES,
  X_GROUP,
  Tiling,
  check_tiling,
  default_tiling,
  supports,
)
from pallas_kernels.triton_params import triton_compiler_params

__all__ = [
  "BLOCK_M",
  "MAX_ROWS",
  "MAX_SPLITS",
  "TARGET_PROGRAMS",
  "WEIGHT_DTYPES",
  "X_GROUP",
  "Tiling",
  "default_tiling",
  "quantized_matmul",
  "supports",
]

FP8_MAX = 448.0  # float8_e4m3fn's largest finite magnitude
MIN_X_SCALE = 2.0**-120  # quantize_x: smaller activation scales (1 / scale past float32) -> 0
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


@dataclass(frozen=True)
class _Static:
  """The kernel's static parameters: steps is block_k slices of K per split; programs is
  Tiling.programs, already at most the number of units."""

  num_rows: int
  block_n: int
  block_k: int
  steps: int
  splits: int
  partial: bool
  fp8_bits: bool
  quantize_x: bool
  programs: int


def _kernel(x_ref, w_ref, scale_ref, o_ref, *, static: _Static):
  rows = jnp.arange(BLOCK_M, dtype=jnp.int32)  # [BM]
  row_mask = (rows < static.num_rows)[:, None]  # [BM, 1]
  rows = jnp.where(rows < static.num_rows, rows, static.num_rows)[:, None]  # [BM, 1], OOB if masked
  fold = functools.partial(_fold, x_ref, w_ref, rows, row_mask, static)
  store = functools.partial(_store, o_ref, scale_ref, rows, row_mask, static)
  shape = (static.block_n, BLOCK_M) if static.quantize_x else (BLOCK_M, static.block_n)
  acc = jnp.zeros(shape, jnp.float32)
  if not static.programs:  # program (column block, split): one unit
    col_block, split = pl.program_id(0), pl.program_id(1)
    first = split * static.steps * static.block_k
    acc = jax.lax.fori_loop(
      0, static.steps, lambda i, acc: fold(col_block, first + i * static.block_k, acc), acc
    )
    store(acc, col_block, split)
    return
  program = pl.program_id(0)  # persistent: units program, program + P, ... in one loop
  num_units = o_ref.shape[-1] // static.block_n * static.splits

  def step(i, acc):
    done = jax.lax.div(i, jnp.int32(static.steps))  # units this program folded before
    k_step = i - done * static.steps
    unit = program + done * static.programs
    col_block = jax.lax.div(unit, jnp.int32(static.splits))
    split = unit - col_block * static.splits
    k = (split * static.steps + k_step) * static.block_k
    acc = fold(col_block, k, jnp.where(k_step == 0, 0.0, acc))

    @pl.when(k_step == static.steps - 1)
    def _():
      store(acc, col_block, split)

    return acc

  num_steps = (num_units - program + static.programs - 1) // static.programs * static.steps
  jax.lax.fori_loop(0, num_steps, step, acc)


def _fold(x_ref, w_ref, rows, row_mask, static: _Static, col_block, k, acc):
  """acc + the unit's product over K slice [k, k + block_k): [BM, BN] (quantize_x: [BN, BM])."""
  lanes = jnp.arange(static.block_k, dtype=jnp.int32)[None, :]  # [1, BK]
  x_mask = jnp.broadcast_to(row_mask, (BLOCK_M, static.block_k))
  x = plgpu.load(x_ref.at[rows, k + lanes], mask=x_mask, other=0)  # [BM, BK]
  w = w_ref[pl.ds(col_block * static.block_n, static.block_n), pl.ds(k, static.block_k)]  # 8-bit
  dims = (((1,), (1,)), ((), ()))
  if static.quantize_x:
    xq, x_scale = _quantize_rows(x)  # [BM, BK] float8_e4m3fn, [BM]
    block = jax.lax.dot_general(w, xq, dims, preferred_element_type=jnp.float32)  # [BN, BM]
    return acc + block * x_scale[None, :]
  w = (_fp8_bits_to_bfloat16(w) if static.fp8_bits else w).astype(x.dtype)  # [BN, BK]
  return acc + jax.lax.dot_general(x, w, dims, preferred_element_type=jnp.float32)  # [BM, BN]


def _store(o_ref, scale_ref, rows, row_mask, static: _Static, acc, col_block, split):
  """Scales a unit's sum and stores it: y [M, N] in x's dtype, or partials [S, M, N] float32."""
  cols = pl.ds(col_block * static.block_n, static.block_n)
  acc = acc.T if static.quantize_x else acc  # [BM, BN]
  scale = scale_ref[cols] * FP8_BITS_SCALE if static.fp8_bits else scale_ref[cols]  # [BN]
  acc = acc * scale[None, :]
  out_cols = col_block * static.block_n + jnp.arange(static.block_n, dtype=jnp.int32)[None, :]
  mask = jnp.broadcast_to(row_mask, (BLOCK_M, static.block_n))
  target = o_ref.at[split, rows, out_cols] if static.partial else o_ref.at[rows, out_cols]
  plgpu.store(target, acc.astype(o_ref.dtype), mask=mask)


@functools.partial(jax.jit, static_argnames=("tiling", "quantize_x", "interpret"))
def _quantized_matmul(x, w, scale, *, tiling: Tiling, quantize_x: bool, interpret: bool):
  (m, k), n = x.shape, w.shape[0]
  splits = tiling.num_splits
  partial = splits > 1
  num_units = n // tiling.block_n * splits
  static = _Static(
    num_rows=m,
    block_n=tiling.block_n,
    block_k=tiling.block_k,
    steps=k // (tiling.block_k * splits),
    splits=splits,
    partial=partial,
    fp8_bits=tiling.fp8_bits and w.dtype == jnp.float8_e4m3fn and not quantize_x,
    quantize_x=quantize_x,
    programs=min(tiling.programs, num_units),
  )
  out_shape = (splits, m, n) if partial else (m, n)
  y = pl.pallas_call(
    functools.partial(_kernel, static=static),
    grid=(static.programs,) if static.programs else (n // tiling.block_n, splits),
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
  check_tiling(tiling, w.shape, quantize_x)
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
