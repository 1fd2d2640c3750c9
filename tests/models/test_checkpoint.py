"""Orbax round trips of params, and the registry's fast-restart layout."""

from __future__ import annotations

import logging
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.cli import main as cli_main
from jaxserve.models.checkpoint import restore_params, save_params
from jaxserve.models.registry import PARAMS_SUBDIR, convert_checkpoint, load_model
from jaxserve.models.tiny_random import tiny_random_config, tiny_random_params
from jaxserve.models.weights import param_shapes


def test_round_trip_equality(tmp_path):
  config = tiny_random_config()
  params = tiny_random_params(config)
  save_params(params, tmp_path / "params")
  restored = restore_params(tmp_path / "params", like=param_shapes(config))
  assert jax.tree.structure(restored) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, restored, params)


def test_restore_logs_gigabytes_per_second(tmp_path, caplog):
  config = tiny_random_config()
  save_params(tiny_random_params(config), tmp_path / "params")
  with caplog.at_level(logging.INFO, logger="jaxserve.models.checkpoint"):
    restore_params(tmp_path / "params", like=param_shapes(config))
  assert any(
    r.getMessage().startswith("weights: ") and "GB/s) from orbax" in r.getMessage()
    for r in caplog.records
  )


def test_round_trip_bfloat16_and_array_like(tmp_path):
  config = tiny_random_config().replace(dtype="bfloat16")
  params = tiny_random_params(config)
  save_params(params, tmp_path / "params")
  restored = restore_params(tmp_path / "params", like=params)
  assert {x.dtype for x in jax.tree.leaves(restored)} == {jnp.dtype(jnp.bfloat16)}
  jax.tree.map(np.testing.assert_array_equal, restored, params)


def test_refusals(tmp_path):
  params = {"a": {"kernel": jnp.ones((2, 3))}}
  save_params(params, tmp_path / "p")
  with pytest.raises(ValueError, match="already exists"):
    save_params(params, tmp_path / "p")
  save_params({"a": {"kernel": jnp.zeros((2, 3))}}, tmp_path / "p", overwrite=True)
  np.testing.assert_array_equal(restore_params(tmp_path / "p", params)["a"]["kernel"], 0)
  with pytest.raises(ValueError, match="not found"):
    restore_params(tmp_path / "missing", params)


def test_registry_restores_converted_checkpoint(hf_checkpoint, tmp_path):
  import shutil

  directory = tmp_path / "qwen3"
  shutil.copytree(hf_checkpoint("qwen3"), directory)
  from_safetensors = load_model(str(directory))
  assert from_safetensors.source.startswith("safetensors:")
  assert convert_checkpoint(directory) == (directory / PARAMS_SUBDIR).absolute()
  from_orbax = load_model(str(directory))
  assert from_orbax.source.startswith("orbax:") and from_orbax.config == from_safetensors.config
  jax.tree.map(np.testing.assert_array_equal, from_orbax.params, from_safetensors.params)


def test_convert_command_makes_later_loads_restore_from_orbax(hf_checkpoint, tmp_path, capsys):
  directory = tmp_path / "ckpt"
  shutil.copytree(hf_checkpoint("qwen3"), directory)
  before = load_model(str(directory))
  assert before.source.startswith("safetensors:")
  assert cli_main(["convert", "--model", str(directory)]) == 0
  assert "jaxserve_params" in capsys.readouterr().out
  after = load_model(str(directory))
  assert after.source.startswith("orbax:")
  for a, b in zip(
    jax.tree_util.tree_leaves(before.params), jax.tree_util.tree_leaves(after.params), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
