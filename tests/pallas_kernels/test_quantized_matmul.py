"""The quantized Pallas matmul (pallas_kernels/quantized_matmul), weight-only and with quantize_x
(x quantized to fp8 per row and 128 of K), against its pure-jnp references and hand-computed
values, persistent programs against the grid, its shape checks, its tiling rule, and its lowering
for CUDA. Compiled on a GPU, in Pallas interpret mode elsewhere."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.quantized_matmul.gpu import (
  TARGET_PROGRAMS,
  X_GROUP,
  Tiling,
  default_tiling,
  quantized_matmul,
  supports,
)
from pallas_kernels.quantized_matmul.reference import (
  quantized_matmul_fp8x_reference,
  quantized_matmul_reference,
)
from tests.pallas_kernels.test_gpu_lowering import _custom_call_targets, _lower_for_cuda

INTERPRET = jax.default_backend() != "gpu"
SMALL = Tiling(block_n=16, block_k=16)


def run(x, w, scale, tiling=SMALL):
  return quantized_matmul(
    jnp.asarray(x), jnp.asarray(w), jnp.asarray(scale), tiling=tiling, interpret=INTERPRET
  )


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.float8_e4m3fn])
@pytest.mark.parametrize("splits,programs", [(1, 0), (2, 0), (2, 1)])
def test_hand_computed(dtype, splits, programs):
  x = np.zeros((3, 32), np.float32)
  x[0, :2] = [1.0, 2.0]  # row 0: 1 * w[:, 0] + 2 * w[:, 1]
  x[1, 31] = -1.0  # row 1: -w[:, 31] (the second K block)
  x[2] = 1.0  # row 2: the row sums of w
  w = np.zeros((16, 32), np.float32)  # [N, K]
  w[0, 0], w[0, 1], w[5, 31] = 3.0, 4.0, 8.0
  w[15] = 2.0
  scale = np.ones(16, np.float32)
  scale[0], scale[15] = 0.5, 0.25
  tiling = Tiling(16, 16, splits, programs=programs)
  out = np.asarray(run(x, jnp.asarray(w).astype(dtype), scale, tiling))
  expected = np.zeros((3, 16), np.float32)
  expected[0, 0], expected[0, 15] = (3 + 8) * 0.5, (2 + 4) * 0.25
  expected[1, 5], expected[1, 15] = -8.0, -0.5
  expected[2, 0], expected[2, 5], expected[2, 15] = 3.5, 8.0, 16.0
  np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
  "m,n,k,dtype,x_dtype,tiling",
  [
    (1, 16, 16, jnp.int8, jnp.float32, SMALL),
    (5, 48, 64, jnp.float8_e4m3fn, jnp.float32, Tiling(16, 32, 2)),
    (8, 128, 256, jnp.int8, jnp.bfloat16, None),
    (16, 64, 512, jnp.float8_e4m3fn, jnp.bfloat16, Tiling(32, 64, 4, num_warps=8)),
    (11, 96, 128, jnp.int8, jnp.bfloat16, Tiling(32, 16, 8)),
    (8, 64, 128, jnp.float8_e4m3fn, jnp.bfloat16, Tiling(32, 32, 2, fp8_bits=True)),
    (3, 32, 64, jnp.float8_e4m3fn, jnp.float32, Tiling(16, 32, fp8_bits=True)),
    (5, 48, 64, jnp.int8, jnp.float32, Tiling(16, 32, 2, programs=2)),
    (11, 96, 128, jnp.float8_e4m3fn, jnp.bfloat16, Tiling(32, 16, 8, programs=5)),
  ],
)
def test_random_sweep_against_reference(m, n, k, dtype, x_dtype, tiling):
  rng = np.random.default_rng(m * n + k)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32).astype(x_dtype)
  w = jnp.asarray(np.clip(rng.standard_normal((n, k)) * 60, -127, 127)).astype(dtype)
  scale = jnp.asarray(rng.random(n) * 0.01 + 1e-3, jnp.float32)
  out = quantized_matmul(x, w, scale, tiling=tiling, interpret=INTERPRET)
  assert out.shape == (m, n) and out.dtype == x_dtype
  reference = np.asarray(quantized_matmul_reference(x, w, scale), np.float32)
  tolerance = 1e-5 if x_dtype == jnp.float32 and INTERPRET else 1e-2  # GPUs: f32 dots in TF32
  np.testing.assert_allclose(np.asarray(out, np.float32), reference, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("splits", [1, 2])
def test_quantize_x_hand_computed(splits):
  """x quantized per row and group of 128: a group whose largest magnitude is 448 keeps scale 1;
  0.875 / 448 is 2**-9 exactly; 1.1 rounds to e4m3's 1.125, which the output shows."""
  x = np.zeros((4, 256), np.float32)
  x[0, :2] = [448.0, 2.0]  # group 0, scale 1: 448 * w[:, 0] + 2 * w[:, 1]
  x[1, 200] = -0.875  # group 1, scale 2**-9: -448 * w[:, 200] * 2**-9
  x[2] = 0.875  # both groups, scale 2**-9: every value 448 before the scale
  x[3, :2] = [448.0, 1.1]  # 1.1 -> 1.125
  w = np.zeros((16, 256), np.float32)  # [N, K]
  w[0, 0], w[0, 1], w[5, 200] = 3.0, 4.0, 8.0
  w[15] = 2.0
  scale = np.ones(16, np.float32)
  scale[0], scale[15] = 0.5, 0.25
  out = quantized_matmul(
    jnp.asarray(x),
    jnp.asarray(w).astype(jnp.float8_e4m3fn),
    jnp.asarray(scale),
    tiling=Tiling(16, X_GROUP, splits),
    quantize_x=True,
    interpret=INTERPRET,
  )
  expected = np.zeros((4, 16), np.float32)
  expected[0, 0], expected[0, 15] = (448 * 3 + 2 * 4) * 0.5, (448 + 2) * 2 * 0.25
  expected[1, 5], expected[1, 15] = -7.0, -0.875 * 2 * 0.25
  expected[2, 0], expected[2, 5], expected[2, 15] = 0.875 * 7 * 0.5, 7.0, 0.875 * 512 * 0.25
  expected[3, 0], expected[3, 15] = (448 * 3 + 1.125 * 4) * 0.5, (448 + 1.125) * 2 * 0.25
  np.testing.assert_array_equal(np.asarray(out), expected)


def test_quantize_x_rows_too_small_to_scale_are_zeros():
  """A group whose scale is below MIN_X_SCALE (1 / scale could overflow float32) quantizes to
  zeros, in the kernel and the reference alike; the other rows are unaffected."""
  rng = np.random.default_rng(1)
  x = np.asarray(rng.standard_normal((3, 128)), np.float32)
  x[1] = 1e-34  # scale 2.2e-37 < 2**-120
  x[2, :64] = 0.0  # a half-zero row is an ordinary row
  w = jnp.asarray(np.clip(rng.standard_normal((16, 128)) * 100, -448, 448)).astype(
    jnp.float8_e4m3fn
  )
  scale = jnp.ones(16, jnp.float32)
  out = np.asarray(quantized_matmul(jnp.asarray(x), w, scale, quantize_x=True, interpret=INTERPRET))
  reference = np.asarray(quantized_matmul_fp8x_reference(jnp.asarray(x), w, scale))
  assert np.all(np.isfinite(out)) and np.all(out[1] == 0) and np.all(reference[1] == 0)
  assert np.any(out[0] != 0) and np.any(out[2] != 0)
  np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "m,n,k,x_dtype,tiling",
  [
    (1, 16, 128, jnp.float32, Tiling(16, 128)),
    (5, 64, 512, jnp.float32, Tiling(32, 128, 2)),
    (8, 128, 256, jnp.bfloat16, None),
    (16, 64, 1024, jnp.bfloat16, Tiling(64, 128, 4, num_warps=8)),
    (11, 96, 384, jnp.bfloat16, Tiling(32, 128, 3)),
    (7, 96, 512, jnp.bfloat16, Tiling(32, 128, 2, programs=4)),
  ],
)
def test_quantize_x_random_sweep_against_reference(m, n, k, x_dtype, tiling):
  rng = np.random.default_rng(m * n + k)
  x = rng.standard_normal((m, k)) * rng.choice([0.01, 1.0, 30.0], size=(m, 1))  # rows' scales
  x = jnp.asarray(x, jnp.float32).astype(x_dtype)
  w = jnp.asarray(np.clip(rng.standard_normal((n, k)) * 100, -448, 448)).astype(jnp.float8_e4m3fn)
  scale = jnp.asarray(rng.random(n) * 0.01 + 1e-3, jnp.float32)
  out = quantized_matmul(x, w, scale, tiling=tiling, quantize_x=True, interpret=INTERPRET)
  assert out.shape == (m, n) and out.dtype == x_dtype
  reference = np.asarray(quantized_matmul_fp8x_reference(x, w, scale), np.float32)
  tolerance = 1e-5 if x_dtype == jnp.float32 and INTERPRET else 1e-2  # GPUs: f32 dots in TF32
  np.testing.assert_allclose(np.asarray(out, np.float32), reference, rtol=tolerance, atol=tolerance)
  weight_only = np.asarray(quantized_matmul_reference(x, w, scale), np.float32)
  assert np.max(np.abs(reference - weight_only)) <= 0.1 * np.max(np.abs(weight_only))


@pytest.mark.parametrize("quantize_x", [False, True])
def test_persistent_programs_give_the_grids_values(quantize_x):
  """Tiling.programs P folds the same units with the same arithmetic, P at a time: 1 program,
  P dividing the 12 units, P leaving some programs a unit fewer, and more programs than units
  (clipped) all equal the grid bit for bit."""
  rng = np.random.default_rng(7)
  x = jnp.asarray(rng.standard_normal((6, 512)), jnp.bfloat16)
  w = jnp.asarray(np.clip(rng.standard_normal((96, 512)) * 60, -127, 127)).astype(jnp.float8_e4m3fn)
  scale = jnp.asarray(rng.random(96) * 0.01 + 1e-3, jnp.float32)
  block_k = X_GROUP if quantize_x else 64

  def out(programs):
    tiling = Tiling(32, block_k, 4, programs=programs)  # 3 column blocks x 4 splits = 12 units
    return np.asarray(
      quantized_matmul(x, w, scale, tiling=tiling, quantize_x=quantize_x, interpret=INTERPRET),
      np.float32,
    )

  grid = out(0)
  assert np.any(grid != 0)
  for programs in (1, 4, 5, 100):
    np.testing.assert_array_equal(out(programs), grid, err_msg=f"programs={programs}")


def test_fp8_bits_converts_every_float8_value_exactly():
  """Tiling.fp8_bits: each of the 254 finite float8_e4m3fn values times a power-of-two scale,
  one weight per output, x = 1. The 14 nonzero subnormals become bfloat16 subnormals: exact on
  a GPU; XLA's CPU (interpret mode) flushes them to zero."""
  codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], np.uint8)  # NaNs out
  codes = np.concatenate([codes, codes[:2]])  # 256 outputs: N a multiple of 16
  values = jnp.asarray(codes).view(jnp.float8_e4m3fn)
  w = jnp.zeros((256, 16), jnp.float8_e4m3fn).at[:, 0].set(values)  # [N, K]
  x = jnp.zeros((1, 16), jnp.float32).at[0, 0].set(1.0)
  scale = jnp.full((256,), 0.25, jnp.float32)
  out = quantized_matmul(x, w, scale, tiling=Tiling(16, 16, fp8_bits=True), interpret=INTERPRET)
  expected = np.asarray(values.astype(jnp.float32)) * 0.25
  subnormal = (codes & 0x78) == 0  # exponent bits 0: the zeros and the subnormals
  if INTERPRET:
    expected[subnormal] = np.where(np.asarray(out)[0][subnormal] == 0, 0, expected[subnormal])
  np.testing.assert_array_equal(np.asarray(out)[0], expected)
  assert np.count_nonzero(expected[~subnormal] == 0) == 0  # every normal value came through


def _args(m=4, n=32, k=64, w_dtype=jnp.int8):
  return (
    jnp.zeros((m, k), jnp.bfloat16),
    jnp.zeros((n, k), w_dtype),
    jnp.zeros((n,), jnp.float32),
  )


@pytest.mark.parametrize(
  "args,tiling,field",
  [
    (_args(m=17), None, "x: expected [M, K] with 1 <= M <= 16"),
    ((jnp.zeros((4, 64), jnp.int8),) + _args()[1:], None, "x: expected bfloat16 or float32"),
    (_args(w_dtype=jnp.bfloat16), None, "w: expected int8 or float8_e4m3fn"),
    ((_args()[0], jnp.zeros((32, 32), jnp.int8), _args()[2]), None, "w: expected"),
    (_args()[:2] + (jnp.zeros((31,), jnp.float32),), None, "scale: expected float32[32]"),
    (_args(n=24), None, "w: N must be a multiple of 16 and K of 16"),
    (_args(), Tiling(24, 16), "tiling: blocks must be powers of two"),
    (_args(), Tiling(64, 16), "tiling: N 32 must be a multiple of block_n"),
    (_args(), Tiling(16, 64, 2), "tiling: N 32 must be a multiple of block_n and K 64"),
    (_args(), Tiling(16, 16, programs=-1), "tiling: programs must be >= 0, got -1"),
  ],
)
def test_bad_shapes_raise_value_errors_naming_the_array(args, tiling, field):
  with pytest.raises(ValueError, match="quantized_matmul: " + field.replace("[", r"\[")):
    quantized_matmul(*args, tiling=tiling, interpret=True)


@pytest.mark.parametrize(
  "args,tiling,field",
  [
    (_args(k=256), None, "w: quantize_x needs float8_e4m3fn, got int8"),
    (_args(k=192, w_dtype=jnp.float8_e4m3fn), None, "w: N must be a multiple of 16 and K of 128"),
    (_args(k=256, w_dtype=jnp.float8_e4m3fn), Tiling(16, 256), "tiling: quantize_x needs block_k"),
  ],
)
def test_quantize_x_refuses_what_it_cannot_run(args, tiling, field):
  with pytest.raises(ValueError, match="quantized_matmul: " + field):
    quantized_matmul(*args, tiling=tiling, quantize_x=True, interpret=True)


def test_default_tiling_divides_and_fills_the_gpu():
  for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (48, 64), (96, 80)):
    tiling = default_tiling(n, k)
    assert n % tiling.block_n == 0 and k % (tiling.block_k * tiling.num_splits) == 0
    programs = n // tiling.block_n * tiling.num_splits
    assert programs >= TARGET_PROGRAMS or tiling.num_splits == 8 or n * k < 1 << 20
  assert default_tiling(4096, 14336).num_splits > 1  # a narrow N splits K
  assert default_tiling(28672, 4096).num_splits == 1
  for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
    tiling = default_tiling(n, k, quantize_x=True)
    assert tiling.block_k == X_GROUP and k % (X_GROUP * tiling.num_splits) == 0
    programs = n // tiling.block_n * tiling.num_splits
    assert tiling.block_n == 128 and (programs >= TARGET_PROGRAMS or tiling.num_splits == 8)
  assert supports(16, 32, 64) and not supports(17, 32, 64) and not supports(4, 24, 64)


@pytest.mark.parametrize(
  "w_dtype,tiling,quantize_x",
  [
    (jnp.int8, None, False),
    (jnp.float8_e4m3fn, None, False),
    (jnp.float8_e4m3fn, Tiling(fp8_bits=True), False),
    (jnp.float8_e4m3fn, None, True),
    (jnp.float8_e4m3fn, Tiling(128, X_GROUP, 8, programs=264), True),
    (jnp.int8, Tiling(32, 256, 2, programs=132), False),
  ],
)
def test_lowers_to_one_triton_call_for_cuda(w_dtype, tiling, quantize_x):
  args = (
    jax.ShapeDtypeStruct((8, 4096), jnp.bfloat16),
    jax.ShapeDtypeStruct((6144, 4096), w_dtype),
    jax.ShapeDtypeStruct((6144,), jnp.float32),
  )
  fn = functools.partial(quantized_matmul, tiling=tiling, quantize_x=quantize_x)
  text = _lower_for_cuda(fn, *args)
  assert _custom_call_targets(text) == {"__gpu$xla.gpu.triton"}
  assert text.count("custom_call @__gpu$xla.gpu.triton") == 1
