"""The built-in models: names that are no checkpoint directory, each with its model config, its
params and its tokenizer. The one place that knows them: loading (models/registry.py, sharded or
not) and the tokenizer of a model name (registry.load_model_tokenizer) ask here.

`tiny-random` (models/tiny_random.py) is a small Llama with deterministic random weights whose
vocabulary is the byte-level tokenizer's (tokenizer/byte_tokenizer.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from jaxserve.models.model_config import ModelConfig
from jaxserve.models.tiny_random import TINY_RANDOM_NAME, tiny_random_config, tiny_random_params
from jaxserve.tokenizer.byte_tokenizer import byte_level_tokenizer
from jaxserve.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class BuiltinModel:
  config: Callable[[], ModelConfig]
  params: Callable[[ModelConfig], dict]
  tokenizer: Callable[[], Tokenizer]


BUILTIN_MODELS: Mapping[str, BuiltinModel] = MappingProxyType(
  {
    TINY_RANDOM_NAME: BuiltinModel(tiny_random_config, tiny_random_params, byte_level_tokenizer),
  }
)


def is_builtin(model: str) -> bool:
  return model in BUILTIN_MODELS


def builtin_config(model: str, dtype: str = "auto") -> ModelConfig:
  """The built-in model's config, in `dtype` ("auto" keeps its own)."""
  config = BUILTIN_MODELS[model].config()
  return config if dtype == "auto" else config.replace(dtype=dtype)


def builtin_params(model: str, config: ModelConfig) -> dict:
  return BUILTIN_MODELS[model].params(config)


def builtin_tokenizer(model: str) -> Tokenizer:
  return BUILTIN_MODELS[model].tokenizer()
