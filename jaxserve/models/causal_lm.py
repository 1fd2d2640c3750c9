"""The flax module that runs a config: one place that maps a family to its decoder class.

Every decoder has the step contract of LlamaForCausalLM (models/llama.py): `__call__(token_ids,
positions, kv_pages, slot_mapping, metadata) -> (hidden, kv_pages)` and `compute_logits(hidden)
-> float32 logits`, so the step programs (device/step_fns.py) run any of them.
"""

from __future__ import annotations

from flax import linen as nn

from jaxserve.attention import AttentionBackend
from jaxserve.models.gemma import GemmaForCausalLM
from jaxserve.models.invariant_dense import DenseBackend
from jaxserve.models.llama import LlamaForCausalLM
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.moe import ExpertsFn


def causal_lm(
  config: ModelConfig,
  attention: AttentionBackend,
  dense: DenseBackend | None = None,
  experts: ExpertsFn | None = None,
) -> nn.Module:
  """The decoder of `config`'s family: GemmaForCausalLM (Gemma 2, Gemma 3), else
  LlamaForCausalLM (Llama, Mistral, Qwen2, Qwen3, and with `experts` Qwen3-MoE and Mixtral)."""
  if config.gemma:
    return GemmaForCausalLM(config, attention, dense)
  return LlamaForCausalLM(config, attention, dense, experts)
