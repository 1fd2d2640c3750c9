"""The GPU greedy sampling kernel against its pure-jnp reference: compiled on a GPU, in Pallas
interpret mode elsewhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.greedy_sample.gpu import greedy_sample
from pallas_kernels.greedy_sample.reference import greedy_sample_reference

INTERPRET = jax.default_backend() != "gpu"


def run(logits, banned_ids, **kwargs):
  return greedy_sample(
    jnp.asarray(logits), jnp.asarray(banned_ids, jnp.int32), interpret=INTERPRET, **kwargs
  )


def test_hand_computed():
  with np.errstate(divide="ignore"):
    logits = np.log(
      np.array(
        [
          [1.0, 3.0, 3.0, 1.0, 2.0, 0.0],
          [4.0, 4.0, 0.0, 0.0, 0.0, 0.0],
          [1.0, 1.0, 1.0, 1.0, 1.0, 5.0],
        ],
        np.float32,
      )
    )
  banned_ids = [[1, -1], [-1, -1], [5, 4]]  # row 0: the first maximum is banned
  ids, log_normalizer = run(logits, banned_ids, block_vocab=16)
  np.testing.assert_array_equal(ids, [2, 0, 0])  # ties go to the first index
  np.testing.assert_allclose(log_normalizer, np.log([10.0, 8.0, 10.0]), rtol=1e-6)
  # 60 entries in 4 blocks over 3 splits of 2 blocks (the last split empty); the banned ids
  # only hit the first copy: row 2's best is the second copy's 5.0
  ids, log_normalizer = run(np.tile(logits, (1, 10)), banned_ids, block_vocab=16, num_splits=3)
  np.testing.assert_array_equal(ids, [2, 0, 11])  # row 0: a tie across splits, the first wins
  np.testing.assert_allclose(log_normalizer, np.log([100.0, 80.0, 100.0]), rtol=1e-6)


def test_every_score_masked_gives_index_zero_and_the_unmasked_normalizer():
  logits = np.array([[-np.inf, 2.0, -np.inf], [-np.inf] * 3], np.float32)
  ids, log_normalizer = run(logits, [[1], [-1]], block_vocab=16)
  np.testing.assert_array_equal(ids, [0, 0])
  np.testing.assert_allclose(log_normalizer, [2.0, -np.inf])


@pytest.mark.parametrize(
  "vocab_size,block_vocab,num_splits",
  [
    (1, 16, 1),
    (16, 16, 1),
    (17, 16, 1),
    (17, 16, 4),
    (1000, 64, 1),
    (1000, 64, 3),
    (4099, 1024, 1),
    (4099, 256, 8),
    (50000, 4096, 2),
  ],
)
def test_random_sweep_against_reference(vocab_size, block_vocab, num_splits):
  rng = np.random.default_rng(vocab_size)
  num_rows = 6
  logits = np.round(rng.normal(0, 4, size=(num_rows, vocab_size))).astype(np.float32)  # ties
  logits[1, rng.random(vocab_size) < 0.5] = -np.inf
  banned_ids = rng.integers(-1, vocab_size, size=(num_rows, 8)).astype(np.int32)
  top = np.argsort(-logits[2], kind="stable")[:8]  # row 2: its top ids banned
  banned_ids[2, :] = -1
  banned_ids[2, : len(top)] = top
  ids, log_normalizer = run(logits, banned_ids, block_vocab=block_vocab, num_splits=num_splits)
  expected_ids, expected_normalizer = greedy_sample_reference(
    jnp.asarray(logits), jnp.asarray(banned_ids)
  )
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_allclose(log_normalizer, expected_normalizer, rtol=1e-6, atol=1e-5)


def test_bfloat16_logits_match_the_reference_on_their_float32_values():
  rng = np.random.default_rng(3)
  logits = jnp.asarray(rng.normal(0, 4, size=(4, 3000)), jnp.bfloat16)
  banned_ids = jnp.full((4, 2), -1, jnp.int32)
  ids, log_normalizer = greedy_sample(logits, banned_ids, block_vocab=512, interpret=INTERPRET)
  expected_ids, expected_normalizer = greedy_sample_reference(
    logits.astype(jnp.float32), banned_ids
  )
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_allclose(log_normalizer, expected_normalizer, rtol=1e-6)


@pytest.mark.parametrize(
  "logits_shape,banned_shape,kwargs,field",
  [
    ((4,), (4, 8), {}, "logits"),
    ((4, 0), (4, 8), {}, "logits"),
    ((4, 10), (3, 8), {}, "banned_ids"),
    ((4, 10), (4, 8), {"block_vocab": 24}, "block_vocab"),
    ((4, 10), (4, 8), {"num_warps": 0}, "num_warps"),
    ((4, 10), (4, 8), {"num_splits": 0}, "num_splits"),
    ((4, 10), (4, 8), {"num_stages": 0}, "num_stages"),
  ],
)
def test_bad_shapes_raise_value_error_naming_the_field(logits_shape, banned_shape, kwargs, field):
  with pytest.raises(ValueError, match=field):
    greedy_sample(
      jnp.zeros(logits_shape, jnp.float32),
      jnp.zeros(banned_shape, jnp.int32),
      interpret=INTERPRET,
      **kwargs,
    )


def test_integer_logits_and_banned_ids_of_another_dtype_raise():
  with pytest.raises(ValueError, match="logits"):
    greedy_sample(jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 1), jnp.int32))
  with pytest.raises(ValueError, match="banned_ids"):
    greedy_sample(jnp.zeros((2, 4), jnp.float32), jnp.zeros((2, 1), jnp.int16))
