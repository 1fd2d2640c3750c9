"""batch_invariant's building blocks: the fixed-order row sum, the row-tiled GEMM, the
fixed-order RMSNorm and sampler normalizer: right values, and rows bitwise the same whatever
the number of rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.device.fixed_order_greedy import fixed_order_greedy
from jaxserve.device.sampler import xla_greedy
from jaxserve.models.batch_invariant_dense import (
  batch_invariant_backend,
  invariant_matmul,
  row_tiled_matmul,
)
from jaxserve.models.layers.norms import RMSNorm
from pallas_kernels.fixed_order import fixed_order_sum

ROW_COUNTS = (1, 3, 8, 17, 64)


def assert_rows_invariant(fn, x):
  full = np.asarray(fn(x))
  for count in ROW_COUNTS:
    np.testing.assert_array_equal(np.asarray(fn(x[:count])), full[:count], err_msg=str(count))


def test_fixed_order_sum_hand_computed():
  # pairwise halving: (1e8 + -1e8) + (1 + 1) = 2; left to right 1e8 + 1 rounds back to 1e8 -> 1
  x = jnp.array([[1e8, 1.0, -1e8, 1.0], [1.0, 2.0, 3.0, 0.0]], jnp.float32)
  np.testing.assert_array_equal(fixed_order_sum(x), [2.0, 6.0])
  np.testing.assert_array_equal(fixed_order_sum(jnp.arange(5.0)[None]), [10.0])  # zero padded
  np.testing.assert_array_equal(fixed_order_sum(jnp.ones((2, 3, 300))), np.full((2, 3), 300.0))


def test_fixed_order_sum_rows_invariant_and_close_to_the_sum():
  x = jax.random.normal(jax.random.key(0), (64, 1000), jnp.float32)
  fn = jax.jit(fixed_order_sum)
  np.testing.assert_allclose(fn(x), np.sum(np.asarray(x, np.float64), axis=1), atol=1e-4)
  assert_rows_invariant(fn, x)


@pytest.mark.parametrize("tile_rows", [8, 32])
def test_row_tiled_matmul(tile_rows):
  x = jax.random.normal(jax.random.key(1), (64, 96), jnp.float32)
  w = jax.random.normal(jax.random.key(2), (96, 48), jnp.float32)
  fn = jax.jit(lambda x: row_tiled_matmul(x, w, jnp.float32, tile_rows))
  tolerance = 1e-4 if jax.default_backend() == "cpu" else 1e-2  # TF32 on a GPU
  np.testing.assert_allclose(fn(x), np.asarray(x) @ np.asarray(w), atol=tolerance, rtol=tolerance)
  assert_rows_invariant(fn, x)


@pytest.mark.parametrize("gemm", ["row_tiles", "pallas"])
def test_backend_projections_and_logits(gemm):
  backend = batch_invariant_backend(gemm, tile_rows=16)
  x = jax.random.normal(jax.random.key(3), (20, 64), jnp.float32).astype(jnp.bfloat16)
  w = (0.1 * jax.random.normal(jax.random.key(4), (64, 128))).astype(jnp.bfloat16)
  for fn in (backend.column, backend.row):
    out = fn(x, w)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
      np.asarray(out, np.float32),
      np.asarray(x, np.float32) @ np.asarray(w, np.float32),
      atol=2e-2,
      rtol=2e-2,
    )
  logits = backend.logits(x, w, False)
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(backend.logits(x, w.T, True), logits, rtol=1e-5, atol=1e-5)  # tied
  assert_rows_invariant(jax.jit(lambda x: backend.logits(x, w, False)), x)


def test_unknown_gemm_raises():
  with pytest.raises(ValueError, match="auto"):
    invariant_matmul("cublas")


def test_fixed_order_rmsnorm():
  x = jax.random.normal(jax.random.key(5), (64, 256), jnp.float32)
  params = {"params": {"scale": 1 + 0.1 * jax.random.normal(jax.random.key(6), (256,))}}
  fixed = jax.jit(lambda x: RMSNorm(1e-6, jnp.float32, fixed_order=True).apply(params, x))
  plain = RMSNorm(1e-6, jnp.float32).apply(params, x)
  np.testing.assert_allclose(fixed(x), plain, rtol=1e-5, atol=1e-6)
  assert_rows_invariant(fixed, x)


def test_fixed_order_greedy():
  logits = 3 * jax.random.normal(jax.random.key(7), (64, 700), jnp.float32)
  logits = logits.at[5].set(-jnp.inf)
  banned = jnp.full((64, 2), -1, jnp.int32).at[0, 0].set(jnp.argmax(logits[0]))
  ids, lse = fixed_order_greedy(logits, banned)
  ref_ids, ref_lse = xla_greedy(logits, banned)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)
  assert np.isneginf(lse[5])
  fn = jax.jit(lambda x: fixed_order_greedy(x, banned[: x.shape[0]])[1])
  assert_rows_invariant(fn, logits)
