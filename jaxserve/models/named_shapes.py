"""Named architectures of published models, for everything that needs a real shape without its
weights: random-weight checkpoints (bench/random_checkpoint.py), the ahead-of-time TPU build
(`jaxserve compile-tpu --model-shape`), benchmarks.

This module is the one owner of these shapes. Each entry holds the published config.json values
(for Gemma 3, its `text_config` with transformers' Gemma3TextConfig defaults for the keys the
published file leaves out); bos/eos are 256 and 257, where the whole-vocabulary tokenizer that
random checkpoints ship with (bench/vocab_tokenizer.py) puts them.

* Llama 3.x: vocabulary 128256, RMSNorm eps 1e-5, RoPE theta 500000 with llama3 scaling from an
  original 8192 positions, 131072 positions.
* Qwen3-30B-A3B (qwen3_moe): 48 layers, hidden 2048, 32 q heads and 4 kv heads of 128, QK-norm,
  128 experts of intermediate 768, top-8 renormalized (norm_topk_prob), vocabulary 151936, RoPE
  theta 1e6 unscaled, 40960 positions, untied. Its dense `intermediate_size` 6144 is published
  but unused (every layer is sparse).
* Mixtral-8x7B (mixtral; mistralai/Mixtral-8x7B-v0.1): 32 layers, hidden 4096, 32 q heads and
  8 kv heads of 128, 8 experts of intermediate 14336, top-2, vocabulary 32000, RMSNorm eps 1e-5,
  RoPE theta 1e6 unscaled, 32768 positions, no sliding window, untied.
* Gemma 3 12B / 27B (gemma3_text): vocabulary 262208, five sliding-window (1024) layers for each
  global one, global RoPE theta 1e6 with linear scaling 8, local base 10000, no soft caps,
  131072 positions, tied embeddings; 12B: 48 layers, hidden 3840, 16 q / 8 kv heads of 256,
  intermediate 15360, query_pre_attn_scalar 256; 27B: 62 layers, hidden 5376, 32 q / 16 kv heads
  of 128, intermediate 21504, query_pre_attn_scalar 168.

Parameter counts (tests/tpu_aot/test_tpu_aot_units.py): llama-3.2-1b 1,235,814,400 (tied
embeddings), llama-3.1-8b 8,030,261,248, llama-3.1-70b 70,553,706,496, qwen3-30b-a3b
30,532,122,624 (3.3B active with the embedding), mixtral-8x7b 46,702,792,704, gemma-3-12b
11,766,034,176 and gemma-3-27b 27,009,346,304 (the language model only: the published
multimodal checkpoints add a vision tower).
"""

from __future__ import annotations

from collections.abc import Callable

from jaxserve.models.model_config import FULL, SLIDING, ModelConfig, RopeScaling

_SPECIAL = dict(bos_token_id=256, eos_token_ids=(257,), dtype="bfloat16")  # vocab_tokenizer ids
_GEMMA3_PATTERN = 6  # layer i is global when (i + 1) % 6 == 0


def _llama3(**shape: object) -> ModelConfig:
  factor = shape.pop("rope_factor")
  return ModelConfig(
    architecture="llama",
    vocab_size=128256,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=RopeScaling("llama3", factor, 1.0, 4.0, 8192),
    max_position_embeddings=131072,
    **_SPECIAL,
    **shape,
  )


def _qwen3_30b_a3b() -> ModelConfig:
  return ModelConfig(
    architecture="qwen3_moe",
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_layers=48,
    num_q_heads=32,
    num_kv_heads=4,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    qk_norm=True,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    norm_topk_prob=True,
    **_SPECIAL,
  )


def _mixtral_8x7b() -> ModelConfig:
  return ModelConfig(
    architecture="mixtral",
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rms_norm_eps=1e-5,
    rope_theta=1_000_000.0,
    max_position_embeddings=32768,
    tie_word_embeddings=False,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=14336,
    norm_topk_prob=True,
    **_SPECIAL,
  )


def gemma3_layer_types(num_layers: int) -> tuple[str, ...]:
  """Gemma 3's pattern: five sliding-window layers, then a global one."""
  return tuple(SLIDING if (i + 1) % _GEMMA3_PATTERN else FULL for i in range(num_layers))


def _gemma3(num_layers: int, **shape: object) -> ModelConfig:
  return ModelConfig(
    architecture="gemma3_text",
    vocab_size=262208,
    num_layers=num_layers,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    rope_scaling=RopeScaling("linear", 8.0),
    rope_local_base_freq=10000.0,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
    qk_norm=True,
    sliding_window=1024,
    layer_types=gemma3_layer_types(num_layers),
    attn_logit_softcapping=None,
    final_logit_softcapping=None,
    **_SPECIAL,
    **shape,
  )


SHAPES: dict[str, Callable[[], ModelConfig]] = {
  "llama-3.2-1b": lambda: _llama3(
    hidden_size=2048,
    intermediate_size=8192,
    num_layers=16,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=64,
    tie_word_embeddings=True,
    rope_factor=32.0,
  ),
  "llama-3.1-8b": lambda: _llama3(
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
    rope_factor=8.0,
  ),
  "llama-3.1-70b": lambda: _llama3(
    hidden_size=8192,
    intermediate_size=28672,
    num_layers=80,
    num_q_heads=64,
    num_kv_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
    rope_factor=8.0,
  ),
  "qwen3-30b-a3b": _qwen3_30b_a3b,
  "mixtral-8x7b": _mixtral_8x7b,
  "gemma-3-12b": lambda: _gemma3(
    48,
    hidden_size=3840,
    intermediate_size=15360,
    num_q_heads=16,
    num_kv_heads=8,
    head_dim=256,
    query_pre_attn_scalar=256.0,
  ),
  "gemma-3-27b": lambda: _gemma3(
    62,
    hidden_size=5376,
    intermediate_size=21504,
    num_q_heads=32,
    num_kv_heads=16,
    head_dim=128,
    query_pre_attn_scalar=168.0,
  ),
}


def named_model_config(name: str) -> ModelConfig:
  """The bfloat16 ModelConfig of the named shape; ValueError naming the known ones otherwise."""
  if name not in SHAPES:
    raise ValueError(f"model shape: unknown {name!r} (known: {', '.join(SHAPES)})")
  return SHAPES[name]()
