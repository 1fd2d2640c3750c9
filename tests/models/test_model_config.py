"""models/hf_config.model_config_from_hf (a config.json dict onto a ModelConfig) over real
transformers config.json files and hand-written dicts."""

from __future__ import annotations

import json

import pytest

from jaxserve.models.hf_config import model_config_from_hf
from jaxserve.models.model_config import ModelConfig, RopeScaling


def _hf_dict(hf_checkpoint, family: str) -> dict:
  return json.loads((hf_checkpoint(family) / "config.json").read_text())


def _llama_dict(**changes) -> dict:
  d = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
  }
  d.update(changes)
  return d


def test_llama(hf_checkpoint):
  config = model_config_from_hf(_hf_dict(hf_checkpoint, "llama"))
  assert (config.architecture, config.num_q_heads, config.num_kv_heads, config.head_dim) == (
    "llama",
    4,
    2,
    64,
  )
  assert (config.hidden_size, config.intermediate_size, config.num_layers) == (128, 256, 2)
  assert config.rope_scaling is None and config.rope_theta == 10000.0
  assert not (config.attention_bias or config.qk_norm or config.tie_word_embeddings)
  assert config.sliding_window is None and config.dtype == "float32"
  assert config.rms_norm_eps == 1e-5 and config.max_position_embeddings == 256
  assert config.bos_token_id == 0 and config.eos_token_ids == (1,)


def test_llama3_rope_scaling(hf_checkpoint):
  config = model_config_from_hf(_hf_dict(hf_checkpoint, "llama3"))
  assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 64)


def test_tied_embeddings(hf_checkpoint):
  assert model_config_from_hf(_hf_dict(hf_checkpoint, "llama_tied")).tie_word_embeddings


def test_mistral_sliding_window(hf_checkpoint):
  config = model_config_from_hf(_hf_dict(hf_checkpoint, "mistral"))
  assert config.architecture == "mistral" and config.sliding_window == 8
  assert config.rope_theta == 1e6 and config.num_kv_heads == 1


def test_qwen2_bias_and_eos_list(hf_checkpoint):
  config = model_config_from_hf(_hf_dict(hf_checkpoint, "qwen2"))
  assert config.architecture == "qwen2" and config.attention_bias and not config.qk_norm
  assert config.sliding_window is None and len(config.eos_token_ids) == 2


def test_qwen3_qk_norm(hf_checkpoint):
  config = model_config_from_hf(_hf_dict(hf_checkpoint, "qwen3"))
  assert config.architecture == "qwen3" and config.qk_norm and not config.attention_bias


def test_transformers4_layout_and_dtype():
  d = _llama_dict(rope_scaling={"type": "linear", "factor": 2.0})
  config = model_config_from_hf(d)
  assert config.rope_theta == 500000.0 and config.rope_scaling == RopeScaling("linear", 2.0)
  assert config.head_dim == 64 and config.dtype == "bfloat16"
  assert model_config_from_hf(_llama_dict(torch_dtype="float16")).dtype == "bfloat16"
  assert model_config_from_hf(d, dtype="float32").dtype == "float32"


def test_model_type_without_architectures():
  d = _llama_dict(architectures=None, model_type="qwen3")
  assert model_config_from_hf(d).qk_norm


@pytest.mark.parametrize(
  "changes, match",
  [
    ({"architectures": ["GPT2LMHeadModel"]}, "architectures: .*GPT2LMHeadModel"),
    ({"architectures": None, "model_type": "gpt2"}, "model_type: .*gpt2"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type: .*yarn"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, "rope_scaling.rope_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"num_key_value_heads": 3}, "num_kv_heads"),
    ({"vocab_size": None}, "vocab_size"),
    ({"eos_token_id": 5000}, "eos_token_ids"),
    ({"torch_dtype": "float64"}, "dtype"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
  ],
)
def test_refusals(changes, match):
  with pytest.raises(ValueError, match=match):
    model_config_from_hf(_llama_dict(**changes))


def test_refuses_bad_dtype_argument():
  with pytest.raises(ValueError, match="dtype"):
    model_config_from_hf(_llama_dict(), dtype="float16")


def test_qwen2_mixed_sliding_layers_refused():
  d = _llama_dict(
    architectures=["Qwen2ForCausalLM"],
    use_sliding_window=True,
    sliding_window=16,
    layer_types=["full_attention", "sliding_attention"],
  )
  with pytest.raises(ValueError, match="layer_types"):
    model_config_from_hf(d)
  d["layer_types"] = ["sliding_attention"] * 2
  assert model_config_from_hf(d).sliding_window == 16


def test_direct_construction_validates():
  with pytest.raises(ValueError, match="head_dim"):
    ModelConfig("llama", 10, 8, 8, 1, 1, 1, head_dim=0)
  with pytest.raises(ValueError, match="rope_scaling.original_max_position_embeddings"):
    RopeScaling("llama3", 8.0)
