"""Model code: config, decoders (Llama family, Gemma), HF weight loading, orbax checkpoints,
registry."""

from jaxserve.models.causal_lm import causal_lm
from jaxserve.models.gemma import GemmaForCausalLM
from jaxserve.models.llama import LlamaForCausalLM
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
