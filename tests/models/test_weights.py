"""Hugging Face safetensors -> flax params: layouts, dtypes and error messages."""

from __future__ import annotations

import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch

from jaxserve.models.weights import (
  INDEX_FILE,
  SINGLE_FILE,
  load_hf_config,
  load_hf_params,
  param_shapes,
)
from tests.models.paged_batch import init_param_shapes


def _abstract(tree):
  return jax.tree.map(lambda x: (x.shape, jnp.dtype(x.dtype)), tree)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama_tied"])
def test_param_tree_matches_model_init(hf_checkpoint, family):
  config = load_hf_config(hf_checkpoint(family))
  init = init_param_shapes(config)
  loaded = load_hf_params(hf_checkpoint(family), config)
  assert _abstract(init) == _abstract(loaded) == _abstract(param_shapes(config))


def test_values_and_layout_against_torch_reader(hf_checkpoint):
  directory = hf_checkpoint("qwen2")
  params = load_hf_params(directory, load_hf_config(directory))
  hf = safetensors.torch.load_file(directory / SINGLE_FILE)
  layer = params["layers_1"]
  np.testing.assert_array_equal(
    layer["self_attn"]["k_proj"]["kernel"], hf["model.layers.1.self_attn.k_proj.weight"].numpy().T
  )
  np.testing.assert_array_equal(
    layer["self_attn"]["v_proj"]["bias"], hf["model.layers.1.self_attn.v_proj.bias"].numpy()
  )
  np.testing.assert_array_equal(
    layer["mlp"]["down_proj"]["kernel"], hf["model.layers.1.mlp.down_proj.weight"].numpy().T
  )
  np.testing.assert_array_equal(params["lm_head"]["kernel"], hf["lm_head.weight"].numpy().T)
  np.testing.assert_array_equal(params["norm"]["scale"], hf["model.norm.weight"].numpy())


def test_sharded_checkpoint_loads_identically(hf_checkpoint):
  single, sharded = hf_checkpoint("qwen3"), hf_checkpoint("qwen3", sharded=True)
  files = set(json.loads((sharded / INDEX_FILE).read_text())["weight_map"].values())
  assert len(files) > 1 and not (sharded / SINGLE_FILE).exists()
  config = load_hf_config(single)
  a, b = load_hf_params(single, config), load_hf_params(sharded, config)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_bfloat16_checkpoint(hf_checkpoint):
  directory = hf_checkpoint("llama", dtype="bfloat16")
  config = load_hf_config(directory)
  assert config.dtype == "bfloat16"
  params = load_hf_params(directory, config)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  hf = safetensors.torch.load_file(directory / SINGLE_FILE)
  np.testing.assert_array_equal(
    np.asarray(params["layers_0"]["self_attn"]["q_proj"]["kernel"], np.float32),
    hf["model.layers.0.self_attn.q_proj.weight"].float().numpy().T,
  )
  as_f32 = load_hf_params(directory, load_hf_config(directory, dtype="float32"))
  assert {x.dtype for x in jax.tree.leaves(as_f32)} == {jnp.dtype(jnp.float32)}


def test_put_receives_every_leaf_path(hf_checkpoint):
  directory = hf_checkpoint("llama")
  config = load_hf_config(directory)
  seen = []
  load_hf_params(directory, config, put=lambda path, array: seen.append(path) or array)
  assert ("lm_head", "kernel") in seen and len(seen) == len(jax.tree.leaves(param_shapes(config)))


def _rewrite(directory, tmp_path, edit):
  """Copies a single-file checkpoint, applying `edit` to its tensors."""
  out = tmp_path / "ckpt"
  shutil.copytree(directory, out)
  tensors = safetensors.numpy.load_file(out / SINGLE_FILE)
  edit(tensors)
  safetensors.numpy.save_file(tensors, out / SINGLE_FILE, metadata={"format": "pt"})
  return out


def test_missing_tensor_names_file_and_tensor(hf_checkpoint, tmp_path):
  name = "model.layers.1.mlp.up_proj.weight"
  out = _rewrite(hf_checkpoint("llama"), tmp_path, lambda t: t.pop(name))
  with pytest.raises(ValueError, match=rf"{SINGLE_FILE}.*{name}"):
    load_hf_params(out, load_hf_config(out))


def test_wrong_shape_names_file_and_tensor(hf_checkpoint, tmp_path):
  name = "model.layers.0.self_attn.k_proj.weight"
  out = _rewrite(hf_checkpoint("llama"), tmp_path, lambda t: t.update({name: t[name][:, :-1]}))
  with pytest.raises(ValueError, match=rf"{SINGLE_FILE}.*{name}.*shape"):
    load_hf_params(out, load_hf_config(out))


def test_missing_shard_names_file_and_tensor(hf_checkpoint, tmp_path):
  out = tmp_path / "ckpt"
  shutil.copytree(hf_checkpoint("qwen3", sharded=True), out)
  weight_map = json.loads((out / INDEX_FILE).read_text())["weight_map"]
  name = "model.norm.weight"
  (out / weight_map[name]).unlink()
  with pytest.raises(ValueError, match=rf"{weight_map[name]}: file not found") as err:
    load_hf_params(out, load_hf_config(out))
  named_tensor = re.search(r"listed for tensor '([^']+)'", str(err.value)).group(1)
  assert weight_map[named_tensor] == weight_map[name]


def test_missing_weights_and_config(hf_checkpoint, tmp_path):
  out = tmp_path / "ckpt"
  shutil.copytree(hf_checkpoint("llama"), out)
  config = load_hf_config(out)
  (out / SINGLE_FILE).unlink()
  with pytest.raises(ValueError, match=f"{SINGLE_FILE}|{INDEX_FILE}"):
    load_hf_params(out, config)
  (out / "config.json").unlink()
  with pytest.raises(ValueError, match="config.json"):
    load_hf_config(out)
