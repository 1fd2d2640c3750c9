"""Loading a mixture of experts' checkpoint (models/expert_weights.py): the stacked leaves against
the per-expert tensors transformers wrote, on the device path and the host (`put`) path, bit for
bit in every device memory layout (streamed, packed in one group or in several), and the
layouts it refuses."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from jaxserve.models.weight_transfer import TransferOptions
from jaxserve.models.weights import (
  SINGLE_FILE,
  load_hf_config,
  load_hf_params,
  load_hf_weights,
  param_shapes,
)
from tests.models.paged_batch import init_param_shapes

# family -> (HF module of the experts, HF names of gate, up, down)
LAYOUT = {
  "qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
  "mixtral": ("block_sparse_moe", ("w1", "w3", "w2")),
}


def _abstract(tree):
  return jax.tree.map(lambda x: (x.shape, jnp.dtype(x.dtype)), tree)


@pytest.mark.parametrize("family", list(LAYOUT))
def test_stacked_leaves_hold_each_experts_tensor(hf_checkpoint, family):
  directory = hf_checkpoint(family)
  config = load_hf_config(directory)
  params = load_hf_params(directory, config)
  assert (
    _abstract(params) == _abstract(init_param_shapes(config)) == _abstract(param_shapes(config))
  )
  hf = safetensors.numpy.load_file(directory / SINGLE_FILE)
  module, names = LAYOUT[family]
  mlp = params["layers_1"]["mlp"]
  prefix = f"model.layers.1.{module}"
  np.testing.assert_array_equal(mlp["gate"]["kernel"], hf[f"{prefix}.gate.weight"].T)
  for ours, theirs in zip(("gate_proj", "up_proj", "down_proj"), names, strict=True):
    for j in range(config.num_experts):
      np.testing.assert_array_equal(
        mlp["experts"][ours][j], hf[f"{prefix}.experts.{j}.{theirs}.weight"].T
      )


@pytest.mark.parametrize("family", list(LAYOUT))
def test_packed_in_groups_stacks_the_streamed_bits(hf_checkpoint, family):
  """bf16 (the published dtype), packed group after group (at most 256 KiB of converted leaves
  a group: an expert leaf [E, in, out] is 128 KiB, made of E raw tensors), against the streamed
  load."""
  directory = hf_checkpoint(family, dtype="bfloat16")
  config = load_hf_config(directory)
  streamed, _ = load_hf_weights(directory, config, options=TransferOptions(layout="streaming"))
  options = TransferOptions(layout="packed", group_bytes=256 << 10)
  packed, stats = load_hf_weights(directory, config, options=options)
  assert 1 < stats.groups < len(jax.tree.leaves(streamed))
  assert jax.tree.map(lambda x: x.dtype, packed) == jax.tree.map(lambda x: x.dtype, streamed)
  expected = jax.tree.map(lambda x: np.asarray(x).tobytes(), streamed)
  assert jax.tree.map(lambda x: np.asarray(x).tobytes(), packed) == expected


def test_host_put_path_stacks_the_same_leaves(hf_checkpoint):
  directory = hf_checkpoint("mixtral")
  config = load_hf_config(directory)
  seen = []
  host = load_hf_params(directory, config, put=lambda path, array: seen.append(path) or array)
  device = load_hf_params(directory, config)
  assert len(seen) == len(jax.tree.leaves(param_shapes(config)))
  jax.tree.map(np.testing.assert_array_equal, host, device)


def test_fused_layout_is_refused_with_its_remedy(hf_checkpoint, tmp_path):
  """What save_pretrained(save_original_format=False) writes: transformers' in-memory layout."""
  out = tmp_path / "fused"
  shutil.copytree(hf_checkpoint("qwen3_moe"), out)
  tensors = safetensors.numpy.load_file(out / SINGLE_FILE)
  names = [
    f"model.layers.0.mlp.experts.{j}.{p}.weight" for j in range(8) for p in ("gate_proj", "up_proj")
  ]
  tensors["model.layers.0.mlp.experts.gate_up_proj"] = np.stack(
    [np.concatenate([tensors[names[2 * j]], tensors[names[2 * j + 1]]]) for j in range(8)]
  )
  for name in names:
    tensors.pop(name)
  safetensors.numpy.save_file(tensors, out / SINGLE_FILE, metadata={"format": "pt"})
  with pytest.raises(ValueError, match="experts.gate_up_proj.*save_original_format=True"):
    load_hf_params(out, load_hf_config(out))


def test_missing_expert_names_its_tensor(hf_checkpoint, tmp_path):
  out = tmp_path / "missing"
  shutil.copytree(hf_checkpoint("mixtral"), out)
  tensors = safetensors.numpy.load_file(out / SINGLE_FILE)
  name = "model.layers.1.block_sparse_moe.experts.5.w3.weight"
  tensors.pop(name)
  safetensors.numpy.save_file(tensors, out / SINGLE_FILE, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=rf"{SINGLE_FILE}.*{name}"):
    load_hf_params(out, load_hf_config(out))
