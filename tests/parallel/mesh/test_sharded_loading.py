"""A safetensors checkpoint loaded into a tp mesh (raw shards moved, transposed on the devices)
gives the same global arrays, shardings and per-device shards as the host-converted load that
preceded it (transpose + cast on the host, then jax.make_array_from_callback)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxserve.models.weight_transfer import TransferOptions
from jaxserve.models.weights import load_hf_config, load_hf_params
from jaxserve.parallel.partition_rules import build_mesh, param_spec
from jaxserve.parallel.sharded_loading import load_model_sharded


def _host_converted(directory, dtype: str, mesh, shard_vocab: bool) -> dict:
  """The loader as it was: each leaf converted on the host, then split over the mesh."""
  config = load_hf_config(directory, dtype)
  size = mesh.shape["model"]

  def put(path, array):
    sharding = jax.sharding.NamedSharding(mesh, param_spec(path, array.shape, size, shard_vocab))
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

  return load_hf_params(directory, config, put=put)


@pytest.mark.parametrize(
  "tp, dtype, invariant",
  [(2, "auto", False), (2, "bfloat16", False), (2, "auto", True), (8, "bfloat16", False)],
)
def test_sharded_load_matches_host_converted_load(hf_checkpoint, tp, dtype, invariant):
  directory = hf_checkpoint("llama_kv8")
  mesh = build_mesh(tp)
  loaded = load_model_sharded(str(directory), dtype, mesh, tp_invariant_reductions=invariant)
  before = _host_converted(directory, dtype, mesh, shard_vocab=not invariant)
  new_leaves = jax.tree_util.tree_leaves_with_path(loaded.params)
  assert jax.tree.structure(loaded.params) == jax.tree.structure(before)
  for (path, new), old in zip(new_leaves, jax.tree.leaves(before)):
    assert new.sharding == old.sharding and new.dtype == old.dtype, path
    np.testing.assert_array_equal(np.asarray(new), np.asarray(old), err_msg=str(path))
    new_shards = sorted(new.addressable_shards, key=lambda s: s.device.id)
    old_shards = sorted(old.addressable_shards, key=lambda s: s.device.id)
    assert [s.index for s in new_shards] == [s.index for s in old_shards], path
    for a, b in zip(new_shards, old_shards):
      np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
  split = [
    x for x in jax.tree.leaves(before) if len({str(s.index) for s in x.addressable_shards}) == tp
  ]
  assert split  # some leaves really are split tp ways


@pytest.mark.parametrize("tp, dtype", [(2, "bfloat16"), (8, "auto")])
def test_packed_layout_gives_the_streamed_shards(hf_checkpoint, tp, dtype):
  """The packed layout (a placeholder on every device of the mesh, raw shards after it, each
  leaf converted into the placeholder's hole) holds the same shards as the streamed load."""
  directory = str(hf_checkpoint("llama_kv8"))
  mesh = build_mesh(tp)
  packed = load_model_sharded(directory, dtype, mesh, transfer=TransferOptions(layout="packed"))
  streamed = load_model_sharded(
    directory, dtype, mesh, transfer=TransferOptions(layout="streaming")
  )
  assert packed.packed and not streamed.packed
  assert jax.tree.structure(packed.params) == jax.tree.structure(streamed.params)
  for new, old in zip(jax.tree.leaves(packed.params), jax.tree.leaves(streamed.params)):
    assert new.sharding == old.sharding and new.dtype == old.dtype
    new_shards = sorted(new.addressable_shards, key=lambda s: s.device.id)
    old_shards = sorted(old.addressable_shards, key=lambda s: s.device.id)
    for a, b in zip(new_shards, old_shards):
      assert a.index == b.index
      assert np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes()
