"""A safetensors checkpoint loaded into a tp mesh (raw shards moved, transposed on the devices)
gives the same global arrays, shardings and per-device shards as the host-converted load that
preceded it (transpose + cast on the host, then jax.make_array_from_callback)."""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest

from jaxserve.models.leaf_load import LeafLoad
from jaxserve.models.packed_layout import plan_packing
from jaxserve.models.transfer_jobs import build_jobs
from jaxserve.models.weight_transfer import TransferOptions
from jaxserve.models.weights import load_hf_config, load_hf_params, plan_hf_tensors
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
  for (path, new), old in zip(new_leaves, jax.tree.leaves(before), strict=True):
    assert new.sharding == old.sharding and new.dtype == old.dtype, path
    np.testing.assert_array_equal(np.asarray(new), np.asarray(old), err_msg=str(path))
    new_shards = sorted(new.addressable_shards, key=lambda s: s.device.id)
    old_shards = sorted(old.addressable_shards, key=lambda s: s.device.id)
    assert [s.index for s in new_shards] == [s.index for s in old_shards], path
    for a, b in zip(new_shards, old_shards, strict=True):
      np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
  split = [
    x for x in jax.tree.leaves(before) if len({str(s.index) for s in x.addressable_shards}) == tp
  ]
  assert split  # some leaves really are split tp ways


@pytest.mark.parametrize(
  "family, tp, dtype, expert_parallel, group_bytes",
  [
    ("llama_kv8", 2, "bfloat16", False, None),
    ("llama_kv8", 8, "auto", False, None),
    ("llama_kv8", 2, "bfloat16", False, 256 << 10),
    ("mixtral", 2, "auto", True, 256 << 10),
    ("mixtral", 2, "bfloat16", False, 256 << 10),
  ],
)
def test_packed_layout_gives_the_streamed_shards(
  hf_checkpoint, caplog, family, tp, dtype, expert_parallel, group_bytes
):
  """The packed layout (a placeholder on every device of the mesh, raw shards after it, each
  leaf converted into the placeholder's hole; in one group, or group after group with at most
  group_bytes of converted shards on a device) holds the same shards as the streamed load: a
  dense model, and a mixture of experts split by expert or within each expert."""
  directory = str(hf_checkpoint(family))
  mesh = build_mesh(tp)

  def load(options: TransferOptions):
    return load_model_sharded(
      directory, dtype, mesh, transfer=options, expert_parallel=expert_parallel
    )

  with caplog.at_level(logging.INFO, logger="jaxserve.models.weights"):
    packed = load(TransferOptions(layout="packed", group_bytes=group_bytes))
  said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("weights: ")]
  assert ("groups)" in said[-1]) is (group_bytes is not None), said
  streamed = load(TransferOptions(layout="streaming"))
  assert packed.packed and not streamed.packed
  assert jax.tree.structure(packed.params) == jax.tree.structure(streamed.params)
  for new, old in zip(
    jax.tree.leaves(packed.params), jax.tree.leaves(streamed.params), strict=True
  ):
    assert new.sharding == old.sharding and new.dtype == old.dtype
    new_shards = sorted(new.addressable_shards, key=lambda s: s.device.id)
    old_shards = sorted(old.addressable_shards, key=lambda s: s.device.id)
    for a, b in zip(new_shards, old_shards, strict=True):
      assert a.index == b.index
      assert np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes()


def test_packed_groups_are_counted_per_device(hf_checkpoint):
  """group_bytes bounds each device's converted shard bytes: at tp 2 a split leaf counts half
  its bytes, so the same bound makes fewer groups than on one device."""
  directory = hf_checkpoint("llama_kv8")
  config = load_hf_config(directory)
  leaves = [LeafLoad(load.path, (load,)) for load in plan_hf_tensors(directory, config)]
  dtype = np.dtype(np.float32)
  mesh = build_mesh(2)

  def sharding(path, shape):
    return jax.sharding.NamedSharding(mesh, param_spec(path, shape, 2, True))

  bound = 512 << 10
  whole = plan_packing(build_jobs(leaves, dtype, None), None, "packed", bound)
  split = plan_packing(build_jobs(leaves, dtype, sharding), mesh, "packed", bound)
  assert sum(whole) == sum(split) == len(leaves)
  assert 1 < len(split) < len(whole)
