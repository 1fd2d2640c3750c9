"""RMSNorm as the model families compute it, statistics in float32.

`RMSNorm` (Llama, Mistral, Qwen): normalized in float32, cast back to the input dtype, then
multiplied by the weight (`scale`, initialized to ones). `GemmaRMSNorm` (Gemma 2 and 3): the
normalized float32 values times (1 + weight) in float32, then cast (`scale` holds the checkpoint's
weight as stored, initialized to zeros), as transformers' Gemma2RMSNorm / Gemma3RMSNorm. A
family picks one (its `DecoderBlocks.norm`, models/layers/decoder.py); `norm_layer(norm, config,
name)` builds it with the config's eps, dtype and order; `IDENTITY_WEIGHT` is the stored weight
that makes each the identity scale (random checkpoints write it). fixed_order (batch_invariant):
the sum of squares in a fixed order (pallas_kernels/fixed_order.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxserve.models.model_config import ModelConfig
from pallas_kernels.fixed_order import fixed_order_sum


def normalized(x: jax.Array, eps: float, fixed_order: bool) -> jax.Array:
  """x [..., H] / rms(x) in float32."""
  x32 = x.astype(jnp.float32)
  if fixed_order:
    mean_square = (fixed_order_sum(x32 * x32) / x.shape[-1])[..., None]
  else:
    mean_square = jnp.mean(x32 * x32, axis=-1, keepdims=True)
  return x32 * jax.lax.rsqrt(mean_square + eps)


class RMSNorm(nn.Module):
  """RMSNorm over the last axis; statistics in float32, weight applied in the input dtype."""

  eps: float
  dtype: jnp.dtype
  fixed_order: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.dtype)
    return scale * normalized(x, self.eps, self.fixed_order).astype(x.dtype)


class GemmaRMSNorm(nn.Module):
  """Gemma's RMSNorm over the last axis: (x / rms(x)) * (1 + weight) in float32, then cast."""

  eps: float
  dtype: jnp.dtype
  fixed_order: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    weight = self.param("scale", nn.initializers.zeros, (x.shape[-1],), self.dtype)
    out = normalized(x, self.eps, self.fixed_order) * (1.0 + weight.astype(jnp.float32))
    return out.astype(x.dtype)


Norm = type[RMSNorm] | type[GemmaRMSNorm]
IDENTITY_WEIGHT: dict[Norm, float] = {RMSNorm: 1.0, GemmaRMSNorm: 0.0}


def norm_layer(norm: Norm, config: ModelConfig, name: str | None = None) -> nn.Module:
  """A `norm` over the hidden (or head) axis with `config`'s eps, dtype and summation order."""
  return norm(config.rms_norm_eps, jnp.dtype(config.dtype), config.batch_invariant, name=name)
