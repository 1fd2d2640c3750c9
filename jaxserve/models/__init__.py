"""Model code: config, the model families (families/: one module each, behind a registry) over
the shared layers (layers/), HF weight loading, orbax checkpoints, model names."""

from jaxserve.models.causal_lm import causal_lm
from jaxserve.models.families.gemma import GemmaForCausalLM
from jaxserve.models.families.llama import LlamaForCausalLM
from jaxserve.models.model_config import ModelConfig, RopeScaling
from jaxserve.models.registry import LoadedModel, load_model, load_model_tokenizer
from jaxserve.models.tiny_random import TINY_RANDOM_NAME, tiny_random_config, tiny_random_params

__all__ = [
  "ModelConfig",
  "RopeScaling",
  "LlamaForCausalLM",
  "GemmaForCausalLM",
  "causal_lm",
  "LoadedModel",
  "load_model",
  "load_model_tokenizer",
  "TINY_RANDOM_NAME",
  "tiny_random_config",
  "tiny_random_params",
]
