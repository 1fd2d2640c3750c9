"""RoPE frequencies against transformers' own rope initialisers."""

from __future__ import annotations

import numpy as np
import pytest
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from jaxserve.models.hf_config import model_config_from_hf
from jaxserve.models.layers.rope import inverse_frequencies


@pytest.mark.parametrize(
  "rope",
  [
    {"rope_type": "default", "rope_theta": 500000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {
      "rope_type": "llama3",
      "rope_theta": 500000.0,
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192,
    },
  ],
)
def test_inverse_frequencies_match_transformers(rope):
  hf = transformers.LlamaConfig(
    hidden_size=512,
    num_attention_heads=4,
    head_dim=128,
    num_key_value_heads=4,
    intermediate_size=64,
    num_hidden_layers=1,
    vocab_size=16,
    max_position_embeddings=131072,
    rope_parameters=rope,
  )
  if rope["rope_type"] == "default":
    want = (
      transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(
        hf
      )[0]
    )
  else:
    want = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")[0]
  got = inverse_frequencies(model_config_from_hf(hf.to_dict()))
  if rope["rope_type"] == "llama3":  # all three regimes are exercised
    wavelen = 2 * np.pi / (want.numpy() * 1.0)
    assert (wavelen < 2048).any() and (wavelen > 8192 * 8).any()
  np.testing.assert_allclose(got, want.numpy(), rtol=2e-6, atol=0)
