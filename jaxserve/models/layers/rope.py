"""Rotary position embeddings with Hugging Face's conventions.

Frequencies are a static function of the config, computed once in numpy float32 exactly as
transformers' `modeling_rope_utils` does ("default", "linear", "llama3"). Gemma 3 has two:
`inverse_frequencies` (rope_theta and rope_scaling: the global layers') and
`local_inverse_frequencies` (rope_local_base_freq, unscaled: the sliding layers'). Rotation uses the
rotate_half convention on contiguous halves of each head (HF permutes the original Llama q/k weights
at conversion time so that this convention is the right one for HF checkpoints). cos/sin are
computed in float32 from integer positions, then cast to the activation dtype, as HF does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.models.model_config import ModelConfig


def _unscaled(head_dim: int, theta: float) -> np.ndarray:
  exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
  return (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)


def local_inverse_frequencies(config: ModelConfig) -> np.ndarray:
  """float32[head_dim // 2] of the sliding layers when config.rope_local_base_freq is set."""
  if config.rope_local_base_freq is None:
    raise ValueError("rope_local_base_freq: not set, every layer rotates by rope_theta")
  return _unscaled(config.head_dim, config.rope_local_base_freq)


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
  """Returns float32[head_dim // 2], the per-pair rotation frequencies after scaling."""
  inv_freq = _unscaled(config.head_dim, config.rope_theta)
  scaling = config.rope_scaling
  if scaling is None:
    return inv_freq
  if scaling.rope_type == "linear":
    return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
  return _llama3_scaled(
    inv_freq,
    scaling.factor,
    scaling.low_freq_factor,
    scaling.high_freq_factor,
    scaling.original_max_position_embeddings,
  )


def _llama3_scaled(
  inv_freq: np.ndarray,
  factor: float,
  low_freq_factor: float,
  high_freq_factor: float,
  old_context_len: int,
) -> np.ndarray:
  """Llama 3.1 scaling (transformers' `_compute_llama3_parameters`)."""
  low_freq_wavelen = old_context_len / low_freq_factor
  high_freq_wavelen = old_context_len / high_freq_factor
  wavelen = np.float32(2 * math.pi) / inv_freq
  scaled = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq)
  smooth = (
    (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
  ).astype(np.float32)
  smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
  is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
  return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(
  positions: jax.Array, inv_freq: np.ndarray, dtype: jnp.dtype
) -> tuple[jax.Array, jax.Array]:
  """Returns (cos, sin), each [T, head_dim] in `dtype`, for int32[T] positions."""
  freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]  # [T, D/2]
  angles = jnp.concatenate([freqs, freqs], axis=-1)  # [T, D]
  return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [T, num_heads, head_dim] by per-token angles (cos, sin [T, head_dim])."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)  # [T, H, D]
  return x * cos[:, None, :] + rotated * sin[:, None, :]
