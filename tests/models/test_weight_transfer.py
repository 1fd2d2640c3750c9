"""Raw tensors moved to the device and converted there give exactly the arrays of a host-side
conversion with safetensors' own reader, for every checkpoint dtype and model dtype, whatever the
thread count, in-flight window and device memory layout (packed or streaming), with q/k/v and
gate/up merged while loading or not."""

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
from jaxserve.models.packed_layout import packed_fits
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


@pytest.mark.parametrize("layout", ["packed", "streaming"])
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize(
  "checkpoint_dtype, model_dtype", [("float32", "auto"), ("bfloat16", "float32")]
)
def test_both_layouts_fused_or_not_match_host_conversion(
  hf_checkpoint, layout, fuse, checkpoint_dtype, model_dtype
):
  directory = hf_checkpoint("qwen2", dtype=checkpoint_dtype, sharded=True)  # biases, 2 files
  config = load_hf_config(directory, model_dtype)
  params, stats = load_hf_weights(
    directory, config, fuse=fuse, options=TransferOptions(2, 4096, layout=layout)
  )
  assert stats.packed is (layout == "packed")
  reference = _reference(directory, config)
  _assert_matches(params, _merged_reference(reference) if fuse else reference)


def test_auto_layout_streams_where_the_device_reports_no_memory(hf_checkpoint):
  directory = hf_checkpoint("llama")
  _, stats = load_hf_weights(directory, load_hf_config(directory))
  assert jax.devices()[0].memory_stats() is None and not stats.packed  # the CPU backend


def test_packed_needs_a_gpu_the_raw_weights_and_twice_the_converted_ones():
  # 10 GiB raw, 10 GiB converted: the hole (10 GiB + margin) must stay smaller than the block
  # after the raw tensors, so more than 30 GiB (plus two margins) must be free
  assert packed_fits("gpu", 10 << 30, 10 << 30, 31 << 30)
  assert not packed_fits("gpu", 10 << 30, 10 << 30, 30 << 30)
  assert not packed_fits("gpu", 10 << 30, 10 << 30, 25 << 30)  # fits, but leaves would go past
  assert not packed_fits("tpu", 10 << 30, 10 << 30, 64 << 30)  # another allocator
  assert not packed_fits("gpu", 1, 1, None)  # no memory statistics


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
