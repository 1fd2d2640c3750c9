"""Raw tensors moved to the device and converted there give exactly the arrays of a host-side
conversion with safetensors' own reader, for every checkpoint dtype and model dtype, whatever the
thread count, in-flight window and device memory layout (packed in one group or in several, or
streaming), with q/k/v and gate/up merged while loading or not; and the packed layout's rule
(models/packed_layout.py) on the byte counts of real shapes."""

from __future__ import annotations

import json
import logging
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.models.leaf_load import LeafLoad, TensorLoad
from jaxserve.models.named_shapes import named_model_config
from jaxserve.models.packed_layout import PACK_MARGIN, layout_groups, pack_groups, packed_fits
from jaxserve.models.safetensors_reader import read_header
from jaxserve.models.transfer_jobs import raw_sharding
from jaxserve.models.weight_transfer import TransferOptions, transfer_tensors
from jaxserve.models.weights import (
  INDEX_FILE,
  SINGLE_FILE,
  hf_tensor_specs,
  load_hf_config,
  load_hf_params,
  load_hf_weights,
  plan_hf_tensors,
)


def _reference(directory, config) -> dict:
  """The conversion as jaxserve did it before: safetensors' numpy reader, host transpose + cast."""
  files = sorted(directory.glob("*.safetensors"))
  tensors = {k: v for f in files for k, v in safetensors.numpy.load_file(f).items()}
  dtype = np.dtype(jnp.dtype(config.dtype))
  out = {}
  for spec in hf_tensor_specs(config):
    array = tensors[spec.hf_name]
    out[spec.path] = np.ascontiguousarray(array.T if spec.transpose else array, dtype=dtype)
  return out


def _assert_matches(params, reference) -> None:
  leaves = {
    tuple(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)
  }
  assert leaves.keys() == reference.keys()
  for path, expected in reference.items():
    got = np.asarray(leaves[path])
    assert got.dtype == expected.dtype and got.shape == expected.shape, path
    assert got.tobytes() == expected.tobytes(), path  # bit-identical, NaN-safe


@pytest.mark.parametrize(
  "checkpoint_dtype, model_dtype",
  [
    ("float32", "auto"),
    ("float32", "bfloat16"),
    ("bfloat16", "auto"),
    ("bfloat16", "float32"),
    ("float16", "auto"),  # float16 checkpoints become bfloat16 (cast on the device)
  ],
)
def test_device_conversion_matches_host_conversion(hf_checkpoint, checkpoint_dtype, model_dtype):
  directory = hf_checkpoint("qwen2", dtype=checkpoint_dtype)  # biases and transposes
  config = load_hf_config(directory, model_dtype)
  _assert_matches(load_hf_params(directory, config), _reference(directory, config))


@pytest.mark.parametrize("threads, window", [(1, 1), (3, 4096), (4, 2 << 30)])
def test_sharded_checkpoint_any_threads_and_window(hf_checkpoint, threads, window):
  directory = hf_checkpoint("qwen3", sharded=True)
  assert not (directory / SINGLE_FILE).exists() and (directory / INDEX_FILE).exists()
  config = load_hf_config(directory)
  params = load_hf_params(directory, config, options=TransferOptions(threads, window))
  _assert_matches(params, _reference(directory, config))


def test_host_put_path_matches_device_path(hf_checkpoint):
  directory = hf_checkpoint("llama_tied", dtype="bfloat16")
  config = load_hf_config(directory)
  host = load_hf_params(directory, config, put=lambda path, array: jax.device_put(array))
  _assert_matches(host, _reference(directory, config))
  _assert_matches(load_hf_params(directory, config), _reference(directory, config))


def test_untransformed_leaves_do_not_alias_the_mapped_file(tmp_path):
  path = tmp_path / "aligned.safetensors"
  blob = json.dumps({"x": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}).encode()
  blob += b" " * (-(8 + len(blob)) % 4096)  # page-aligned data: a CPU device could alias it
  expected = np.arange(1024, dtype=np.float32)
  path.write_bytes(struct.pack("<Q", len(blob)) + blob + expected.tobytes())
  header = read_header(path)
  loads = [TensorLoad(("x",), header, header.tensors["x"], transpose=False)]
  leaves, stats = transfer_tensors(
    [LeafLoad(load.path, (load,)) for load in loads], np.dtype(np.float32)
  )
  assert stats.num_bytes == 4096
  with open(path, "r+b") as f:  # a buffer sharing the file's pages would see this write
    f.seek(header.tensors["x"].begin)
    f.write(b"\xff" * 4096)
  np.testing.assert_array_equal(np.asarray(leaves[("x",)]), expected)


def test_plan_is_in_spec_order_with_file_ranges(hf_checkpoint):
  directory = hf_checkpoint("qwen3", sharded=True)
  config = load_hf_config(directory)
  loads = plan_hf_tensors(directory, config)
  assert [load.path for load in loads] == [spec.path for spec in hf_tensor_specs(config)]
  assert len({load.header.path for load in loads}) > 1
  assert all(load.info.nbytes == np.prod(load.info.shape) * 4 for load in loads)


def test_log_states_gigabytes_per_second(hf_checkpoint, caplog):
  directory = hf_checkpoint("llama")
  with caplog.at_level(logging.INFO, logger="jaxserve.models.weights"):
    load_hf_params(directory, load_hf_config(directory))
  assert any(
    r.getMessage().startswith("weights: ") and "GB/s" in r.getMessage() for r in caplog.records
  )


def test_raw_sharding_is_the_transposed_target():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
  target = NamedSharding(mesh, P(None, "model"))
  assert raw_sharding(target, transpose=True).spec == P("model", None)
  assert raw_sharding(target, transpose=False) is target
  assert raw_sharding(NamedSharding(mesh, P()), transpose=True).spec == P(None, None)


def _merged_reference(reference: dict) -> dict:
  """The reference with each layer's q/k/v and gate/up concatenated along the output axis."""
  groups = {
    ("self_attn", "qkv_proj"): ("q_proj", "k_proj", "v_proj"),
    ("mlp", "gate_up_proj"): ("gate_proj", "up_proj"),
  }
  out = {}
  for path, array in reference.items():
    group = next(
      (
        key
        for key, names in groups.items()
        if len(path) == 4 and path[1] == key[0] and path[2] in names
      ),
      None,
    )
    if group is None:
      out[path] = array
    elif path[2] == groups[group][0]:
      parts = [reference[(path[0], path[1], name, path[3])] for name in groups[group]]
      out[(path[0], path[1], group[1], path[3])] = np.concatenate(parts, axis=-1)
  return out


GROUP_BYTES = 256 << 10  # packs the tiny checkpoints' 20-odd leaves in a few groups
LAYOUTS = {
  "packed": TransferOptions(2, 4096, layout="packed"),
  "packed_groups": TransferOptions(2, 4096, layout="packed", group_bytes=GROUP_BYTES),
  "streaming": TransferOptions(2, 4096, layout="streaming"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize(
  "checkpoint_dtype, model_dtype", [("float32", "auto"), ("bfloat16", "float32")]
)
def test_both_layouts_fused_or_not_match_host_conversion(
  hf_checkpoint, layout, fuse, checkpoint_dtype, model_dtype
):
  directory = hf_checkpoint("qwen2", dtype=checkpoint_dtype, sharded=True)  # biases, 2 files
  config = load_hf_config(directory, model_dtype)
  params, stats = load_hf_weights(directory, config, fuse=fuse, options=LAYOUTS[layout])
  assert stats.packed is layout.startswith("packed")
  assert (stats.groups > 1) is (layout == "packed_groups")
  reference = _reference(directory, config)
  _assert_matches(params, _merged_reference(reference) if fuse else reference)


def test_auto_layout_streams_where_the_device_reports_no_memory(hf_checkpoint):
  directory = hf_checkpoint("llama")
  _, stats = load_hf_weights(directory, load_hf_config(directory))
  assert jax.devices()[0].memory_stats() is None and not stats.packed  # the CPU backend


def test_quantized_on_load_in_groups_gives_the_streamed_leaves(hf_checkpoint):
  """fp8 on load: a custom conversion with two outputs (kernel, scale) per projection."""
  directory = hf_checkpoint("qwen2", dtype="bfloat16")
  config = load_hf_config(directory).replace(quantization="fp8")
  streamed, _ = load_hf_weights(directory, config, options=LAYOUTS["streaming"])
  grouped, stats = load_hf_weights(directory, config, options=LAYOUTS["packed_groups"])
  assert stats.groups > 1
  _assert_matches(grouped, _flat(streamed))


def _flat(params) -> dict:
  return {
    tuple(k.key for k in path): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_leaves_with_path(params)
  }


GIB = 2**30


def test_packed_in_one_group_where_raw_and_twice_the_converted_weights_fit():
  # 10 GiB raw, 10 GiB converted: the hole (10 GiB + margin) must stay smaller than the block
  # after the raw tensors, so more than 30 GiB (plus two margins) must be free
  assert packed_fits(0, 10 * GIB, 10 * GIB, 31 * GIB)
  assert not packed_fits(0, 10 * GIB, 10 * GIB, 30 * GIB)
  assert not packed_fits(GIB, 10 * GIB, 10 * GIB, 31 * GIB)  # after 1 GiB of earlier leaves
  jobs = [GIB] * 10
  assert layout_groups("auto", "gpu", jobs, jobs, 31 * GIB) == (10,)


def test_groups_where_the_weights_fit_but_not_three_times():
  # 10 jobs of 1 GiB raw and converted in 20 GiB: group 1 takes 6 (6 + 2 x (6 + margin) < 20),
  # group 2 the other 4 after group 1's 6 GiB of leaves (6 + 4 + 2 x (4 + margin) < 20)
  jobs = [GIB] * 10
  groups = pack_groups(jobs, jobs, 20 * GIB)
  assert groups == (6, 4)
  assert not packed_fits(0, 7 * GIB, 7 * GIB, 20 * GIB)  # group 1 is as large as fits
  assert packed_fits(6 * GIB, 4 * GIB, 4 * GIB, 20 * GIB)
  assert layout_groups("auto", "gpu", jobs, jobs, 20 * GIB) == (6, 4)


def test_qwen3_30b_a3b_packs_in_two_groups_on_an_h200():
  """The real shape's leaves (bf16, unfused; each layer's experts one leaf per projection) in
  the H200's arena at cache.memory_fraction 0.9: too large to pack at once (the old rule
  streamed it and charged 25% of the weights), packed in two groups."""
  config = named_model_config("qwen3-30b-a3b")
  leaves: dict = {}
  for spec in hf_tensor_specs(config):
    leaves[spec.path] = leaves.get(spec.path, 0) + int(np.prod(spec.hf_shape)) * 2
  sizes = list(leaves.values())
  free = int(0.9 * 139.8 * GIB)
  assert 56 * GIB < sum(sizes) < 58 * GIB
  assert not packed_fits(0, sum(sizes), sum(sizes), free)
  groups = layout_groups("auto", "gpu", sizes, sizes, free)
  assert len(groups) == 2 and sum(groups) == len(sizes)
  first, second = sum(sizes[: groups[0]]), sum(sizes[groups[0] :])
  assert packed_fits(0, first, first, free) and packed_fits(first, second, second, free)


def test_auto_streams_without_a_gpu_or_statistics_or_where_a_leaf_does_not_fit():
  jobs = [GIB] * 2
  assert layout_groups("auto", "tpu", jobs, jobs, 64 * GIB) is None  # another allocator
  assert layout_groups("auto", "gpu", jobs, jobs, None) is None  # no memory statistics
  assert pack_groups([8 * GIB], [8 * GIB], 20 * GIB) is None  # 8 + 2 x (8 + margin) > 20
  assert pack_groups([GIB, 3 * GIB], [GIB, 3 * GIB], 10 * GIB) is None  # the 2nd, after one
  assert layout_groups("auto", "gpu", [8 * GIB], [8 * GIB], 20 * GIB) is None
  with pytest.raises(ValueError, match="^layout: 'packed' does not fit"):
    layout_groups("packed", "gpu", [8 * GIB], [8 * GIB], 20 * GIB)


def test_group_bytes_bounds_each_group_unless_one_leaf_is_larger():
  mib = 2**20
  assert pack_groups([mib] * 7, [mib] * 7, None) == (7,)  # no statistics, no bound: one group
  assert pack_groups([mib] * 7, [mib] * 7, None, 3 * mib) == (3, 3, 1)
  assert pack_groups([mib, 5 * mib, mib], [mib, 5 * mib, mib], None, 3 * mib) == (1, 1, 1)
  # the free memory still bounds a group below group_bytes
  free = 2 * (2 * mib + PACK_MARGIN) + 4 * mib + 1  # two jobs and their hole after two placed
  assert pack_groups([mib] * 4, [mib] * 4, free, 64 * mib) == (2, 2)
  with pytest.raises(ValueError, match="^group_bytes: must be a positive"):
    TransferOptions(group_bytes=0)


def test_unknown_layout_is_refused():
  with pytest.raises(ValueError, match="^layout: must be one of"):
    TransferOptions(layout="compact")


def test_packed_refuses_leaves_spread_over_different_placements(hf_checkpoint):
  directory = hf_checkpoint("llama")
  config = load_hf_config(directory)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
  single = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def sharding(path, shape):  # the norms on the device, the rest on a mesh
    return single if path[-1] == "scale" else NamedSharding(mesh, P())

  with pytest.raises(ValueError, match="^layout: 'packed' needs every leaf"):
    load_hf_weights(directory, config, sharding=sharding, options=TransferOptions(layout="packed"))
  params, stats = load_hf_weights(directory, config, sharding=sharding)  # auto: streams
  assert not stats.packed and jax.tree.leaves(params)
