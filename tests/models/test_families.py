"""The model-family registry (models/families/): every name it lists is transformers' own, each
tiny checkpoint resolves to its family, whose decoder builds exactly the params its weight table
loads, an unknown architecture is refused with the supported ones listed, and each family refuses
a config it does not run."""

from __future__ import annotations

import json

import jax
import pytest
import transformers

from jaxserve.models import causal_lm
from jaxserve.models.families import BY_ARCHITECTURE, BY_HF_NAME, FAMILIES, family_of
from jaxserve.models.hf_config import model_config_from_hf
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.weights import load_hf_config, param_shapes
from tests.models.paged_batch import init_param_shapes

# The tiny checkpoints (tests/models/hf_checkpoints.py) and the family each one belongs to.
CHECKPOINT_FAMILY = {
  "llama": "llama",
  "llama_tied": "llama",
  "mistral": "llama",
  "qwen2": "qwen",
  "qwen3": "qwen",
  "qwen3_moe": "qwen3_moe",
  "mixtral": "mixtral",
  "gemma2": "gemma",
  "gemma3": "gemma",
}
SMALL = dict(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=1, num_q_heads=1)


def test_the_registry_lists_transformers_architectures_and_their_model_types():
  assert len(BY_HF_NAME) == 8 and len(FAMILIES) == 5
  for hf_name, family in BY_HF_NAME.items():
    architecture = family.architectures[hf_name]
    assert getattr(transformers, hf_name).config_class.model_type == architecture
    assert BY_ARCHITECTURE[architecture] is family


@pytest.mark.parametrize("checkpoint", sorted(CHECKPOINT_FAMILY))
def test_a_checkpoint_runs_its_familys_decoder_over_its_weight_table(hf_checkpoint, checkpoint):
  config = load_hf_config(hf_checkpoint(checkpoint))
  family = family_of(config)
  assert family.name == CHECKPOINT_FAMILY[checkpoint]
  assert type(causal_lm(config, None)) is family.decoder
  shapes = lambda tree: jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype), tree)
  assert shapes(init_param_shapes(config)) == shapes(param_shapes(config))


def test_an_unknown_architecture_lists_the_supported_ones(hf_checkpoint):
  d = json.loads((hf_checkpoint("llama") / "config.json").read_text())
  with pytest.raises(ValueError, match="^architectures: ") as refused:
    model_config_from_hf({**d, "architectures": ["GPT2LMHeadModel"]})
  assert all(name in str(refused.value) for name in BY_HF_NAME)
  with pytest.raises(ValueError, match="^architecture: unsupported architecture 'gpt2'") as err:
    family_of(ModelConfig("gpt2", **SMALL, num_kv_heads=1, head_dim=8))
  assert all(name in str(err.value) for name in BY_ARCHITECTURE)


def test_each_family_refuses_a_config_it_does_not_run():
  experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
  dense = ModelConfig("gemma2", **SMALL, num_kv_heads=1, head_dim=8, **experts)
  with pytest.raises(ValueError, match="^num_experts: must be 0 for gemma2"):
    family_of(dense)
  with pytest.raises(ValueError, match="^num_experts: must be a positive integer for mixtral"):
    family_of(ModelConfig("mixtral", **SMALL, num_kv_heads=1, head_dim=8))
