"""Gemma 2 and Gemma 3 config.json -> ModelConfig (models/families/gemma.py): transformers 5.x
files as transformers writes them, the hub's older layout, refusals naming the field, and the
params tree."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from jaxserve.models.families import family_of
from jaxserve.models.families.gemma import GemmaForCausalLM
from jaxserve.models.hf_config import model_config_from_hf
from jaxserve.models.model_config import ModelConfig, RopeScaling
from jaxserve.models.weights import load_hf_config, load_hf_params, param_shapes
from tests.models.hf_checkpoints import GEMMA2_WINDOW, GEMMA3_WINDOW
from tests.models.paged_batch import init_param_shapes

S, F = "sliding_attention", "full_attention"


def _hub_gemma2(**changes) -> dict:
  """A Gemma 2 config.json as on the hub (transformers 4.x keys: no layer_types)."""
  d = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "vocab_size": 256000,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
  }
  d.update(changes)
  return d


def _hub_gemma3(**changes) -> dict:
  """A Gemma 3 text config.json as on the hub (legacy rope keys, sliding_window_pattern)."""
  d = _hub_gemma2(
    architectures=["Gemma3ForCausalLM"],
    model_type="gemma3_text",
    num_hidden_layers=7,
    sliding_window=512,
    sliding_window_pattern=6,
    rope_theta=1_000_000.0,
    rope_local_base_freq=10000.0,
    rope_scaling={"rope_type": "linear", "factor": 8.0},
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
    query_pre_attn_scalar=168,
  )
  d.update(changes)
  return d


def test_gemma2_checkpoint(hf_checkpoint):
  d = json.loads((hf_checkpoint("gemma2") / "config.json").read_text())
  config = model_config_from_hf(d)
  assert config.architecture == "gemma2" and config.tie_word_embeddings
  assert family_of(config).decoder is GemmaForCausalLM
  assert config.layer_types == (S, F) and config.sliding_window == GEMMA2_WINDOW
  assert [config.layer_window(i) for i in range(2)] == [GEMMA2_WINDOW, None]
  assert config.attn_logit_softcapping == 2.0 and config.final_logit_softcapping == 5.0
  assert config.sm_scale == 48**-0.5 and not config.qk_norm
  assert config.rope_local_base_freq is None and not config.uses_local_rope(0)


def test_gemma3_checkpoint(hf_checkpoint):
  d = json.loads((hf_checkpoint("gemma3") / "config.json").read_text())
  config = model_config_from_hf(d)
  assert config.architecture == "gemma3_text" and config.qk_norm and config.tie_word_embeddings
  assert config.layer_types == (S, S, F) and config.sliding_window == GEMMA3_WINDOW
  assert config.attn_logit_softcapping is None and config.final_logit_softcapping is None
  assert config.rope_local_base_freq == 10000.0 and config.rope_theta == 1e6
  assert config.rope_scaling == RopeScaling("linear", 2.0)
  assert [config.uses_local_rope(i) for i in range(3)] == [True, True, False]


def test_hub_gemma2_alternates_from_a_sliding_layer():
  config = model_config_from_hf(_hub_gemma2())
  assert config.layer_types == (S, F, S, F) and config.dtype == "bfloat16"
  assert config.rope_theta == 10000.0 and config.rope_scaling is None
  assert config.attn_logit_softcapping == 50.0 and config.sm_scale == 256**-0.5


def test_hub_gemma2_defaults_of_absent_keys():
  d = _hub_gemma2(hidden_size=512)
  for key in ("final_logit_softcapping", "attn_logit_softcapping", "head_dim", "sliding_window"):
    del d[key]
  config = model_config_from_hf(d)
  assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
  assert config.head_dim == 256 and config.sliding_window == 4096 and config.tie_word_embeddings


def test_hub_gemma3_pattern_and_legacy_rope():
  config = model_config_from_hf(_hub_gemma3())
  assert config.layer_types == (S,) * 5 + (F, S)
  assert [config.layer_window(i) for i in (0, 5, 6)] == [512, None, 512]
  assert config.rope_theta == 1e6 and config.rope_scaling == RopeScaling("linear", 8.0)
  assert config.rope_local_base_freq == 10000.0 and config.sm_scale == 168**-0.5


def test_gemma3_ignores_attention_soft_cap_as_transformers_does():
  config = model_config_from_hf(_hub_gemma3(attn_logit_softcapping=50.0))
  assert config.attn_logit_softcapping is None


@pytest.mark.parametrize(
  "d, match",
  [
    (_hub_gemma2(hidden_activation="gelu"), "hidden_activation"),
    (_hub_gemma3(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (_hub_gemma2(layer_types=[S, "chunked_attention", S, F]), "layer_types"),
    (_hub_gemma2(layer_types=[S, F]), "layer_types"),
    (_hub_gemma2(sliding_window=None), "sliding_window"),
    (_hub_gemma2(final_logit_softcapping=-1.0), "final_logit_softcapping"),
    (_hub_gemma3(sliding_window_pattern=0), "sliding_window_pattern"),
    (
      _hub_gemma3(
        rope_parameters={
          S: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
          F: {"rope_type": "default", "rope_theta": 1e6},
        }
      ),
      "rope_parameters.sliding_attention.rope_type",
    ),
    (_hub_gemma3(rope_scaling={"rope_type": "yarn", "factor": 8.0}), "rope_scaling.rope_type"),
    (_hub_gemma3(architectures=["Gemma3ForConditionalGeneration"]), "architectures"),
  ],
)
def test_refusals_name_the_field(d, match):
  with pytest.raises(ValueError, match=match):
    model_config_from_hf(d)


def test_direct_construction_validates_the_layer_fields():
  base = dict(architecture="gemma2", vocab_size=10, hidden_size=8, intermediate_size=8)
  base.update(num_layers=2, num_q_heads=1, num_kv_heads=1, head_dim=8)
  with pytest.raises(ValueError, match="sliding_window"):
    ModelConfig(**base, layer_types=(S, F))
  with pytest.raises(ValueError, match="query_pre_attn_scalar"):
    ModelConfig(**base, query_pre_attn_scalar=0)
  config = ModelConfig(**base, layer_types=[S, F], sliding_window=4)
  assert config.layer_types == (S, F) and config.layer_window(0) == 4


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_param_tree_matches_model_init(hf_checkpoint, family):
  config = load_hf_config(hf_checkpoint(family))
  loaded = load_hf_params(hf_checkpoint(family), config)
  abstract = lambda tree: jax.tree.map(lambda x: (x.shape, jnp.dtype(x.dtype)), tree)
  assert abstract(init_param_shapes(config)) == abstract(loaded) == abstract(param_shapes(config))
  assert "lm_head" not in loaded and "pre_feedforward_layernorm" in loaded["layers_0"]
