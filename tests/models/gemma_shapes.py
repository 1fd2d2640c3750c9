"""Published Gemma shapes without weights, for tests of what depends on the layer layout alone
(KV groups, page counts, the planner)."""

from __future__ import annotations

from jaxserve.models.model_config import ModelConfig

S, F = "sliding_attention", "full_attention"


def gemma3(num_layers: int, window: int = 1024) -> ModelConfig:
  """A Gemma 3 text shape: five sliding layers, then a global one."""
  return ModelConfig(
    architecture="gemma3_text",
    vocab_size=262208,
    hidden_size=3840,
    intermediate_size=15360,
    num_layers=num_layers,
    num_q_heads=16,
    num_kv_heads=8,
    head_dim=256,
    sliding_window=window,
    layer_types=tuple(F if (i + 1) % 6 == 0 else S for i in range(num_layers)),
    query_pre_attn_scalar=256,
    rope_local_base_freq=10000.0,
    qk_norm=True,
    tie_word_embeddings=True,
    dtype="bfloat16",
  )
