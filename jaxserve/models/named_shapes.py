"""Named architectures of published models, for everything that needs a real shape without its
weights: random-weight checkpoints (bench/random_checkpoint.py), the ahead-of-time TPU build
(`jaxserve compile-tpu --model-shape`), benchmarks.

This module is the one owner of these shapes. Each entry holds the published config.json values
(Llama 3.x: vocabulary 128256, RMSNorm eps 1e-5, RoPE theta 500000 with llama3 scaling from an
original 8192 positions, 131072 positions); bos/eos are 256 and 257, where the whole-vocabulary
tokenizer that random checkpoints ship with (bench/vocab_tokenizer.py) puts them. Parameter counts:
llama-3.2-1b 1,235,814,400 (tied embeddings), llama-3.1-8b 8,030,261,248, llama-3.1-70b
70,553,706,496.
"""

from __future__ import annotations

from jaxserve.models.model_config import ModelConfig, RopeScaling

_LLAMA3_VOCAB = 128256
SHAPES = {
  "llama-3.2-1b": dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_layers=16,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=64,
    tie_word_embeddings=True,
    rope_factor=32.0,
  ),
  "llama-3.1-8b": dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
    rope_factor=8.0,
  ),
  "llama-3.1-70b": dict(
    hidden_size=8192,
    intermediate_size=28672,
    num_layers=80,
    num_q_heads=64,
    num_kv_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
    rope_factor=8.0,
  ),
}


def named_model_config(name: str) -> ModelConfig:
  """The bfloat16 ModelConfig of the named shape; ValueError naming the known ones otherwise."""
  if name not in SHAPES:
    raise ValueError(f"model shape: unknown {name!r} (known: {', '.join(SHAPES)})")
  shape = dict(SHAPES[name])
  factor = shape.pop("rope_factor")
  return ModelConfig(
    architecture="llama",
    vocab_size=_LLAMA3_VOCAB,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=RopeScaling("llama3", factor, 1.0, 4.0, 8192),
    max_position_embeddings=131072,
    bos_token_id=256,
    eos_token_ids=(257,),
    dtype="bfloat16",
    **shape,
  )  # byte tokenizer ids
