"""Model code: config, Llama-family decoder, HF weight loading, orbax checkpoints, registry."""

from jaxserve.models.llama import LlamaForCausalLM
from jaxserve.models.model_config import ModelConfig, RopeScaling
from jaxserve.models.registry import LoadedModel, load_model, load_model_tokenizer
from jaxserve.models.tiny_random import TINY_RANDOM_NAME, tiny_random_config, tiny_random_params

__all__ = [
  "ModelConfig",
  "RopeScaling",
  "LlamaForCausalLM",
  "LoadedModel",
  "load_model",
  "load_model_tokenizer",
  "TINY_RANDOM_NAME",
  "tiny_random_config",
  "tiny_random_params",
]
