"""The tp-invariant projections (models/invariant_dense.py): grouped GEMMs give the product of the
whole matrices, keep nn.Dense's params, and reject shapes the groups do not divide."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from jaxserve.models.invariant_dense import (
  InvariantDense,
  column_groups,
  grouped_dense_backend,
  row_group_partials,
)


def _integers(rng, shape) -> jax.Array:
  """Small integers: every product and sum below is exact in float32, so results compare bitwise."""
  return jnp.asarray(rng.integers(-4, 5, size=shape), jnp.float32)


@pytest.mark.parametrize("num_groups", [1, 2, 4])
def test_groups_compute_the_whole_product(num_groups):
  rng = np.random.default_rng(num_groups)
  x, kernel = _integers(rng, (5, 8)), _integers(rng, (8, 12))
  expected = np.asarray(x) @ np.asarray(kernel)
  np.testing.assert_array_equal(np.asarray(column_groups(x, kernel, num_groups)), expected)
  np.testing.assert_array_equal(np.asarray(row_group_partials(x, kernel, num_groups)), expected)


def test_row_partials_are_float32_and_summed_before_rounding():
  x = jnp.asarray([[1.0, 1.0]], jnp.bfloat16)
  kernel = jnp.asarray([[1.0], [2.0**-9]], jnp.bfloat16)  # 1 + 2^-9 needs more than 8 bits
  partial = row_group_partials(x, kernel, 2)
  assert partial.dtype == jnp.float32
  assert float(partial[0, 0]) == 1.0 + 2.0**-9
  backend = grouped_dense_backend(2)
  assert backend.row(x, kernel).dtype == jnp.bfloat16


def test_hand_computed_column_groups():
  x = jnp.asarray([[1.0, 2.0]])
  kernel = jnp.asarray([[1.0, 0.0, 3.0, 1.0], [0.0, 1.0, 1.0, -1.0]])
  np.testing.assert_array_equal(np.asarray(column_groups(x, kernel, 2)), [[1.0, 2.0, 5.0, -1.0]])


def test_groups_must_divide_the_dimension():
  x, kernel = jnp.ones((2, 6)), jnp.ones((6, 9))
  with pytest.raises(ValueError, match="column projection: 9 is not divisible into 2 groups"):
    column_groups(x, kernel, 2)
  with pytest.raises(ValueError, match="row projection: 6 is not divisible into 4 groups"):
    row_group_partials(x, kernel, 4)


@pytest.mark.parametrize("kind", ["column", "row"])
def test_invariant_dense_has_the_params_and_values_of_nn_dense(kind):
  x = jax.random.normal(jax.random.key(0), (3, 4, 16), jnp.float32)
  dense = nn.Dense(8, use_bias=True)
  invariant = InvariantDense(8, jnp.float32, kind, grouped_dense_backend(2), use_bias=True)
  params = dense.init(jax.random.key(1), x)
  params = jax.tree.map(lambda p: p + 0.5, params)  # a non-zero bias
  assert jax.tree.map(jnp.shape, invariant.init(jax.random.key(1), x)) == jax.tree.map(
    jnp.shape, params
  )
  np.testing.assert_allclose(
    invariant.apply(params, x), dense.apply(params, x), rtol=1e-5, atol=1e-5
  )


def test_invariant_dense_rejects_an_unknown_kind():
  with pytest.raises(ValueError, match="kind must be 'column' or 'row'"):
    InvariantDense(4, jnp.float32, "diagonal", grouped_dense_backend(2)).init(
      jax.random.key(0), jnp.ones((1, 4))
    )
