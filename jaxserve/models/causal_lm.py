"""The flax module that runs a config: its family's decoder (models/families/), the one place a
config becomes a model.

Every decoder is a `CausalLM` (models/layers/decoder.py) with the step contract `__call__(token_ids,
positions, kv_pages, slot_mapping, metadata) -> (hidden, kv_pages)` and `compute_logits(hidden)
-> float32 logits`, so the step programs (device/step_fns.py) run any of them.
"""

from __future__ import annotations

from jaxserve.attention import AttentionBackend
from jaxserve.models.families import family_of
from jaxserve.models.invariant_dense import DenseBackend
from jaxserve.models.layers.decoder import CausalLM
from jaxserve.models.layers.moe import ExpertsFn
from jaxserve.models.model_config import ModelConfig


def causal_lm(
  config: ModelConfig,
  attention: AttentionBackend,
  dense: DenseBackend | None = None,
  experts: ExpertsFn | None = None,
) -> CausalLM:
  """The decoder of `config`'s family over these backends (`experts`: a mixture of experts')."""
  return family_of(config).decoder(config, attention, dense, experts)
