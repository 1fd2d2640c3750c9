"""invariant_experts.grouped_expert_ffn: the experts cut into slices (by expert or by intermediate
column) add up to the uncut expert_ffn, in float32 within rounding, empty experts included; a
cut that does not divide names what it cuts. (Bitwise one device against two:
tests/parallel/mesh/test_expert_parallel.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models.grouped_matmul import expert_ffn
from jaxserve.models.invariant_experts import grouped_expert_ffn
from jaxserve.models.layers.moe import route

T, E, K, H, FFN = 6, 8, 2, 16, 32  # fewer tokens x K than experts: some experts get none


def _inputs():
  keys = jax.random.split(jax.random.PRNGKey(3), 5)
  x = jax.random.normal(keys[0], (T, H), jnp.float32)
  weights, ids = route(jax.random.normal(keys[1], (T, E)), K, True)
  gate = jax.random.normal(keys[2], (E, H, FFN)) * 0.2
  up = jax.random.normal(keys[3], (E, H, FFN)) * 0.2
  down = jax.random.normal(keys[4], (E, FFN, H)) * 0.2
  return x, ids, weights, gate, up, down


@pytest.mark.parametrize("by_expert", [False, True], ids=["by_column", "by_expert"])
@pytest.mark.parametrize("num_groups", [1, 2, 4])
def test_the_slices_add_up_to_the_uncut_ffn(by_expert, num_groups):
  args = _inputs()
  assert len(set(np.asarray(args[1]).ravel().tolist())) < E  # an empty expert
  whole = expert_ffn(*args, kernel="ragged_dot")
  cut = grouped_expert_ffn(*args, 0, num_groups, by_expert)
  assert cut.dtype == jnp.float32 and cut.shape == (T, H)
  np.testing.assert_allclose(np.asarray(cut), np.asarray(whole), rtol=1e-5, atol=1e-5)


def test_a_cut_that_does_not_divide_names_what_it_cuts():
  args = _inputs()
  with pytest.raises(ValueError, match="experts: 8 is not divisible into 3 groups"):
    grouped_expert_ffn(*args, 0, 3, True)
  with pytest.raises(ValueError, match="moe_intermediate_size: 32 is not divisible into 3"):
    grouped_expert_ffn(*args, 0, 3, False)
  with pytest.raises(ValueError, match="num_groups: expected at least 1"):
    grouped_expert_ffn(*args, 0, 0, True)
