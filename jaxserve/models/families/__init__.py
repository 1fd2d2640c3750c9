"""THE REGISTRY of model families, keyed by the Hugging Face `architectures` name (as vLLM's
model registry): each family is one module of this package (family.py says what it provides),
and this table is the one place that lists them. Adding a family is its module, one line in
`FAMILIES` and its tests.

* `resolve_hf(d)`: a config.json dict -> (ModelConfig.architecture, family), by its
  `architectures` entry (exactly one, a supported name), else by its `model_type`; anything else
  is a ValueError naming the field and listing the supported names.
* `family_of(config)`: the family of a ModelConfig's `architecture`, after its `check`; an
  unknown architecture is a ValueError listing the supported ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from jaxserve.config.require import require as _require
from jaxserve.models.families.family import ModelFamily
from jaxserve.models.families.gemma import FAMILY as GEMMA
from jaxserve.models.families.llama import FAMILY as LLAMA
from jaxserve.models.families.mixtral import FAMILY as MIXTRAL
from jaxserve.models.families.qwen import FAMILY as QWEN
from jaxserve.models.families.qwen3_moe import FAMILY as QWEN3_MOE
from jaxserve.models.model_config import ModelConfig

FAMILIES: tuple[ModelFamily, ...] = (
  LLAMA,  # LlamaForCausalLM, MistralForCausalLM
  QWEN,  # Qwen2ForCausalLM, Qwen3ForCausalLM
  GEMMA,  # Gemma2ForCausalLM, Gemma3ForCausalLM
  QWEN3_MOE,  # Qwen3MoeForCausalLM
  MIXTRAL,  # MixtralForCausalLM
)
BY_HF_NAME: Mapping[str, ModelFamily] = MappingProxyType(
  {hf: family for family in FAMILIES for hf in family.architectures}
)
BY_ARCHITECTURE: Mapping[str, ModelFamily] = MappingProxyType(
  {arch: family for family in FAMILIES for arch in family.architectures.values()}
)


def resolve_hf(d: Mapping) -> tuple[str, ModelFamily]:
  """(ModelConfig.architecture, family) of config.json dict `d` (module docstring)."""
  names = d.get("architectures") or []
  if names:
    _require(
      len(names) == 1 and names[0] in BY_HF_NAME,
      "architectures",
      f"unsupported architecture {', '.join(map(str, names))!r} "
      f"(supported: {', '.join(BY_HF_NAME)})",
    )
    family = BY_HF_NAME[names[0]]
    return family.architectures[names[0]], family
  model_type = d.get("model_type")
  _require(
    model_type in BY_ARCHITECTURE,
    "model_type",
    f"unsupported architecture {model_type!r} (supported: {', '.join(BY_ARCHITECTURE)})",
  )
  return model_type, BY_ARCHITECTURE[model_type]


def family_of(config: ModelConfig) -> ModelFamily:
  """The family of `config.architecture`, whose rules `config` satisfies."""
  family = BY_ARCHITECTURE.get(config.architecture)
  _require(
    family is not None,
    "architecture",
    f"unsupported architecture {config.architecture!r} (supported: {', '.join(BY_ARCHITECTURE)})",
  )
  family.check(config)
  return family
