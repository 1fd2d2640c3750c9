"""The built-in `tiny-random` model: a small Llama with deterministic random weights.

It needs no download and runs anywhere, so the engine, server and benchmarks can be exercised end
to end on CPU. Its vocabulary matches the byte tokenizer (ids 0..255 are bytes, 256 <s>, 257 </s>,
258+ chat specials). Weights come from numpy's default_rng(0), drawn leaf by leaf in sorted tree
order. Scales are variance-preserving (projections ~ N(0, 1/fan_in), embeddings ~ N(0, 1)) so that
the residual stream stays informative and logits are spread out: greedy decoding from different
prompts produces different, non-constant token streams.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.models.model_config import ModelConfig
from jaxserve.models.weights import hf_tensor_specs

TINY_RANDOM_NAME = "tiny-random"
_SEED = 0


def tiny_random_config() -> ModelConfig:
  return ModelConfig(
    architecture="llama",
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_layers=2,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=64,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    bos_token_id=256,
    eos_token_ids=(257,),
    dtype="float32",
  )


def tiny_random_params(config: ModelConfig) -> dict:
  """Deterministic params for `config` (the tiny-random config, possibly in another dtype)."""
  rng = np.random.default_rng(_SEED)
  specs = sorted(hf_tensor_specs(config), key=lambda spec: spec.path)
  params: dict = {}
  for spec in specs:
    kind = spec.path[-1]
    if kind == "scale":
      value = np.ones(spec.shape, np.float32)
    elif kind == "embedding":
      value = rng.standard_normal(spec.shape, dtype=np.float32)
    else:  # kernel [in, out] or bias [out]
      fan_in = spec.shape[0] if kind == "kernel" else config.hidden_size
      value = rng.standard_normal(spec.shape, dtype=np.float32) / np.float32(np.sqrt(fan_in))
    node = params
    for key in spec.path[:-1]:
      node = node.setdefault(key, {})
    node[spec.path[-1]] = jax.device_put(value.astype(jnp.dtype(config.dtype)))
  return params
