"""investigations/sampling_filter_threshold.py: the sort-free filter keeps the sampler's tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from investigations.sampling_filter_threshold import (
  _draw,
  key_to_float,
  ordered_keys,
  sorting_filter,
  threshold_filter,
)


def test_keys_follow_the_float_order_and_map_back():
  floats = np.array([-np.inf, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, np.inf], np.float32)
  keys = np.asarray(ordered_keys(jnp.asarray(floats)))
  assert (np.diff(keys.astype(np.int64)) >= 0).all() and keys[3] == keys[4]  # -0.0 is +0.0
  np.testing.assert_array_equal(np.asarray(key_to_float(jnp.asarray(keys))), floats + 0.0)


def test_the_kept_sets_equal_the_sorting_filters():
  # top_k 3 keeps 3, 2.5 and the three tied 1s; over those five top_p 0.52 keeps 3 and 2.5
  logits = np.full((1, 64), -5.0, np.float32)
  logits[0, :5] = [3.0, 2.5, 1.0, 1.0, 1.0]
  args = (jnp.asarray(logits), jnp.array([3]), jnp.array([0.52]), jnp.array([0.0]))
  kept = np.isfinite(np.asarray(threshold_filter(*args)))
  assert np.nonzero(kept[0])[0].tolist() == [0, 1]
  rng = np.random.default_rng(0)
  ours, theirs = jax.jit(threshold_filter), jax.jit(sorting_filter)
  for _ in range(3):  # peaked and flat rows, a quarter with many ties, every filter setting
    draw = _draw(rng, 32, 512)
    np.testing.assert_array_equal(
      np.isfinite(np.asarray(ours(*draw))), np.isfinite(np.asarray(theirs(*draw)))
    )
