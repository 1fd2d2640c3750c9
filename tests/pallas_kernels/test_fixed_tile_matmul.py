"""The fixed-tile Pallas matmul against its pure-jnp reference, and its point: a row's result is
bitwise the same whatever the number of rows. Compiled on a GPU, in Pallas interpret mode
elsewhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.fixed_tile_matmul.gpu import fixed_tile_matmul
from pallas_kernels.fixed_tile_matmul.reference import matmul_reference

INTERPRET = jax.default_backend() != "gpu"
SMALL = (16, 16, 16)
F32_TOLERANCE = 1e-5 if INTERPRET else 5e-3  # Triton's float32 dot runs in TF32 on a GPU


def run(x, w, out_dtype=None, blocks=SMALL, **kwargs):
  return fixed_tile_matmul(
    jnp.asarray(x), jnp.asarray(w), out_dtype, blocks=blocks, interpret=INTERPRET, **kwargs
  )


def test_hand_computed():
  x = np.zeros((3, 32), np.float32)
  x[0, :2] = [1.0, 2.0]  # row 0: 1 * w[0] + 2 * w[1]
  x[1, 31] = -1.0  # row 1: -w[31] (the second K block)
  x[2] = 1.0  # row 2: the column sums
  w = np.zeros((32, 16), np.float32)
  w[0, 0], w[1, 0], w[31, 5] = 3.0, 0.5, 4.0
  w[:, 15] = np.arange(32)
  out = np.asarray(run(x, w, jnp.float32))
  expected = np.zeros((3, 16), np.float32)
  expected[0, 0], expected[0, 15] = 4.0, 2.0
  expected[1, 5], expected[1, 15] = -4.0, -31.0
  expected[2, 0], expected[2, 5], expected[2, 15] = 3.5, 4.0, 496.0
  np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
  "m,k,n,blocks,dtype",
  [
    (1, 16, 16, SMALL, jnp.float32),
    (17, 64, 32, SMALL, jnp.float32),
    (40, 128, 64, (32, 32, 64), jnp.bfloat16),
    (130, 64, 256, (64, 128, 32), jnp.bfloat16),
  ],
)
def test_random_sweep_against_reference(m, k, n, blocks, dtype):
  kx, kw = jax.random.split(jax.random.key(m))
  x = jax.random.normal(kx, (m, k), jnp.float32).astype(dtype)
  w = (jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k)).astype(dtype)
  out = run(x, w, blocks=blocks)
  assert out.shape == (m, n) and out.dtype == dtype
  tolerance = F32_TOLERANCE if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(
    np.asarray(out, np.float32),
    np.asarray(matmul_reference(x, w, dtype), np.float32),
    atol=tolerance,
    rtol=tolerance,
  )


def test_transposed_weight():
  x = jax.random.normal(jax.random.key(5), (20, 64), jnp.float32)
  w = jax.random.normal(jax.random.key(6), (64, 48), jnp.float32) / 8.0  # / sqrt(K): TF32
  out = run(x, jnp.asarray(np.asarray(w).T), w_transposed=True)  # w given [N, K]
  np.testing.assert_allclose(
    out, matmul_reference(x, w, jnp.float32), atol=F32_TOLERANCE, rtol=F32_TOLERANCE
  )
  with pytest.raises(ValueError, match="N, K"):
    run(x, w, w_transposed=True)


def test_rows_are_bitwise_the_same_whatever_the_row_count():
  x = jax.random.normal(jax.random.key(0), (70, 64), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (64, 32), jnp.float32)
  full = np.asarray(run(x, w))
  for m in (1, 5, 16, 17, 33):
    np.testing.assert_array_equal(np.asarray(run(x[:m], w)), full[:m])


@pytest.mark.parametrize(
  "x_shape,w_shape,blocks,match",
  [
    ((4, 32), (16, 16), SMALL, "expected x"),
    ((4, 32), (32, 24), SMALL, "multiple"),
    ((4, 24), (24, 16), SMALL, "multiple"),
    ((4, 32), (32, 16), (16, 16, 8), "powers of two"),
    ((4, 32), (32, 16), (16, 24, 16), "powers of two"),
  ],
)
def test_bad_shapes_raise(x_shape, w_shape, blocks, match):
  with pytest.raises(ValueError, match=match):
    run(np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32), blocks=blocks)


def test_mixed_dtypes_raise():
  with pytest.raises(ValueError, match="share a dtype"):
    run(np.zeros((2, 16), np.float32), jnp.zeros((16, 16), jnp.bfloat16))
