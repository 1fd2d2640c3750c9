"""compressed-tensors' quantization_config -> our scheme, and the one rule of which scheme a
model runs (resolve_quantization). Host only: no jax, no checkpoint."""

from __future__ import annotations

import pytest

from jaxserve.quantization.compressed_tensors import resolve_quantization, stored_quantization
from tests.models.compressed_checkpoints import quantization_config


@pytest.mark.parametrize(
  "name,strategy,static",
  [
    ("fp8", "channel", False),
    ("fp8", "tensor", True),
    ("fp8_w8a16", "channel", False),
    ("int8", "tensor", False),
    ("int8_w8a8", "channel", False),
    ("int8_w8a8", "channel", True),
  ],
)
def test_llm_compressors_schemes(name, strategy, static):
  stored = stored_quantization({"quantization_config": quantization_config(name, strategy, static)})
  found = (stored.scheme.name, stored.strategy, stored.static_input_scale)
  assert found == (name, strategy, static)


def test_a_float_checkpoint_has_none():
  assert stored_quantization({"architectures": ["LlamaForCausalLM"]}) is None


def _config(**changes) -> dict:
  qc = quantization_config("fp8")
  group = qc["config_groups"]["group_0"]
  for key, value in changes.items():
    where, _, field = key.partition("__")
    target = {"weights": group["weights"], "inputs": group["input_activations"], "qc": qc}[where]
    target[field] = value
  return {"quantization_config": qc}


@pytest.mark.parametrize(
  "changes,message",
  [
    ({"weights__num_bits": 4}, "weights float 4-bit channel"),
    ({"weights__symmetric": False}, "weights float 8-bit channel asymmetric"),
    ({"weights__strategy": "block"}, "weights float 8-bit block"),
    ({"inputs__type": "int"}, "supported activations: none, or 8-bit symmetric"),
    ({"inputs__dynamic": False}, "supported activations"),  # static per token: no such thing
    ({"inputs__strategy": "group"}, "activations float 8-bit group"),
    ({"qc__format": "int-quantized"}, "format: 'int-quantized' does not store float"),
    ({"qc__ignore": ["model.layers.0.mlp.down_proj"]}, "leaves attention or dense MLP"),
    ({"qc__kv_cache_scheme": {"num_bits": 8}}, "kv_cache_scheme: a quantized KV cache"),
  ],
)
def test_what_does_not_run_is_named_in_one_line(changes, message):
  with pytest.raises(ValueError) as err:
    stored_quantization(_config(**changes))
  assert str(err.value).startswith("quantization_config: ") and message in str(err.value)
  assert "\n" not in str(err.value)


def test_dynamic_per_tensor_activations_run_per_token():
  stored = stored_quantization(_config(inputs__strategy="tensor"))
  assert (stored.scheme.name, stored.static_input_scale) == ("fp8", False)


def test_two_groups_are_refused():
  config = _config()
  groups = config["quantization_config"]["config_groups"]
  groups["group_1"] = groups["group_0"]
  with pytest.raises(ValueError, match="config_groups: one group is supported, got 2"):
    stored_quantization(config)


def test_ignore_may_name_lm_head_by_pattern():
  assert stored_quantization(_config(qc__ignore=["re:.*lm_head"])).scheme.name == "fp8"


def test_which_scheme_runs():
  stored = stored_quantization(_config())
  assert resolve_quantization("none", None) == "none"
  assert resolve_quantization("int8", None) == "int8"  # quantized on load
  assert resolve_quantization("none", stored) == "fp8"  # as stored
  assert resolve_quantization("fp8", stored) == "fp8"
  with pytest.raises(ValueError, match="^quantization: the checkpoint is stored as fp8"):
    resolve_quantization("int8_w8a8", stored)
