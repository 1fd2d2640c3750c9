"""device/sleep_mode.py: weights to host memory and back, on the CPU devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.device.sleep_mode import offload, release, restore


def test_offload_deletes_the_arrays_and_restore_brings_them_back_as_they_were():
  device = jax.devices()[0]
  committed = jax.device_put(jnp.arange(12, dtype=jnp.bfloat16).reshape(3, 4), device)
  uncommitted = jnp.ones((5,), jnp.float32)
  tree = {"a": committed, "b": {"tied": committed, "x": uncommitted}, "scale": 0.5}
  expected = {k: np.asarray(v) for k, v in (("a", committed), ("x", uncommitted))}
  host = offload(tree)
  assert committed.is_deleted() and uncommitted.is_deleted()
  back = restore(host)
  assert back["scale"] == 0.5
  assert back["a"] is back["b"]["tied"]  # one array at two leaves stays one
  assert back["a"].sharding == committed.sharding and back["a"].committed
  assert not back["b"]["x"].committed  # it was not committed: it is not now
  assert back["a"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(back["a"]), expected["a"])
  np.testing.assert_array_equal(np.asarray(back["b"]["x"]), expected["x"])
  release(back)
  assert back["a"].is_deleted() and back["b"]["x"].is_deleted()
