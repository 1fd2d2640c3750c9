"""device/token_bitmask.apply_token_bitmask against hand-computed cases and a numpy reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.device.token_bitmask import apply_token_bitmask, bitmask_words

apply = jax.jit(apply_token_bitmask)


def reference(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
  """Bit by bit, with Python ints (the layout llguidance documents)."""
  out = logits.copy()
  for s in range(logits.shape[0]):
    for t in range(logits.shape[1]):
      word = int(bitmask[s, t // 32]) & 0xFFFFFFFF
      if not (word >> (t % 32)) & 1:
        out[s, t] = -np.inf
  return out


def test_hand_computed():
  logits = np.arange(2 * 40, dtype=np.float32).reshape(2, 40)
  bitmask = np.array(
    [
      [0b101, 1 << 1],  # tokens 0, 2 and 33
      [-1, -1],
    ],
    dtype=np.int32,
  )  # unconstrained
  out = np.asarray(apply(logits, bitmask))
  expected_row0 = np.full(40, -np.inf, np.float32)
  expected_row0[[0, 2, 33]] = logits[0, [0, 2, 33]]
  np.testing.assert_array_equal(out[0], expected_row0)
  np.testing.assert_array_equal(out[1], logits[1])


def test_sign_bit_is_token_31():
  logits = np.zeros((1, 32), np.float32)
  out = np.asarray(apply(logits, np.array([[np.iinfo(np.int32).min]], np.int32)))
  assert np.isfinite(out[0]).tolist() == [False] * 31 + [True]


@pytest.mark.parametrize("num_rows, vocab", [(1, 1), (3, 31), (2, 32), (5, 33), (4, 100), (3, 257)])
def test_random_sweep_matches_reference(num_rows, vocab):
  rng = np.random.default_rng(vocab)
  logits = rng.normal(size=(num_rows, vocab)).astype(np.float32)
  bitmask = rng.integers(
    np.iinfo(np.int32).min,
    np.iinfo(np.int32).max,
    endpoint=True,
    size=(num_rows, bitmask_words(vocab)),
    dtype=np.int32,
  )
  bitmask[0] = -1  # one unconstrained row
  np.testing.assert_array_equal(np.asarray(apply(logits, bitmask)), reference(logits, bitmask))


def test_bitmask_words():
  assert [bitmask_words(v) for v in (1, 32, 33, 128256)] == [1, 1, 2, 4008]


@pytest.mark.parametrize(
  "logits_shape, bitmask, match",
  [
    ((2, 40), np.zeros((2, 1), np.int32), "expected shape"),
    ((2, 40), np.zeros((3, 2), np.int32), "expected shape"),
    ((2, 40), np.zeros((2, 2), np.uint32), "int32"),
    ((40,), np.zeros((2,), np.int32), "2-D"),
  ],
)
def test_shape_validation(logits_shape, bitmask, match):
  with pytest.raises(ValueError, match=match):
    apply_token_bitmask(jnp.zeros(logits_shape, jnp.float32), jnp.asarray(bitmask))


def test_integer_logits_are_rejected():
  with pytest.raises(ValueError, match="floating"):
    apply_token_bitmask(jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 1), jnp.int32))
