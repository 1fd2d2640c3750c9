"""What a model family's module provides: the `ModelFamily` record the registry
(models/families/__init__.py) maps architecture names to.

A family owns everything that is particular to it, and nothing else reads which family a config
is (tests/architecture/test_families.py checks that no family flag or family-name comparison happens
outside models/families/):
* `architectures`: the Hugging Face `architectures` names it runs, each with the
  `ModelConfig.architecture` (the HF `model_type`) it becomes;
* `config_fields(d, architecture)`: config.json -> the ModelConfig fields (the dtype aside, which
  models/hf_config.py reads), with the shared readers of models/hf_fields.py; a field the family's
  code does not implement is a ValueError naming it;
* `check(config)`: the family's rules on a ModelConfig however it was made (e.g. a dense family
  holds no experts); `families.family_of` runs it;
* `tensor_specs(config)`: its HF tensor names -> params table (models/hf_tensors.py composes the
  shared layers'; models/weights.py loads by it);
* `decoder`: its flax decoder, a `CausalLM` (models/layers/decoder.py) whose `blocks` are the
  family's choices (norm, activation, MLP, layer, embedding scale); models/causal_lm.py builds it;
* `config_writers`: per architecture, the config.json fields beyond the shared ones for the
  random-weight checkpoints (models/hf_config_json.py); an architecture without one is not
  written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from jaxserve.models.layers.decoder import CausalLM
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.tensor_spec import TensorSpec

ConfigWriter = Callable[[ModelConfig], dict[str, object]]


@dataclass(frozen=True)
class ModelFamily:
  """One family (module docstring)."""

  name: str
  architectures: Mapping[str, str]  # HF architectures name -> ModelConfig.architecture
  config_fields: Callable[[Mapping, str], dict[str, object]]
  check: Callable[[ModelConfig], None]
  tensor_specs: Callable[[ModelConfig], list[TensorSpec]]
  decoder: type[CausalLM]
  config_writers: Mapping[str, ConfigWriter] = field(default_factory=dict)

  def config_writer(self, config: ModelConfig) -> ConfigWriter | None:
    """The config.json writer of `config`'s architecture, if the family has one."""
    return self.config_writers.get(config.architecture)

  def hf_name(self, architecture: str) -> str:
    """The HF `architectures` name of one of the family's architectures."""
    return next(hf for hf, arch in self.architectures.items() if arch == architecture)
