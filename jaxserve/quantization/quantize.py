"""Symmetric 8-bit quantizers (device side): each projection kernel per output channel (a row of
its [out, in] layout, matmul.py's: K contiguous for cuBLASLt's "TN" fp8 / int8 GEMMs), each
token's activations per row. A scale is the slice's largest magnitude over the type's (448 for
e4m3, 127 for int8), in float32, so the largest value maps onto the type's largest; a slice of
zeros gets scale 1. Values are multiplied by their scale's reciprocal (XLA rewrites a division
by a broadcast scale that way; written out, the numpy reference computes the same bits), then
clipped (and rounded half to even
for int8) to the type. reference.py is the same in numpy, bitwise."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.quantization.scheme import QuantScheme


def _check_float(name: str, x: jax.Array) -> None:
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name}: must be a floating-point array, got {x.dtype}")


def to_quantized(x: jax.Array, scheme: QuantScheme) -> jax.Array:
  """float32 values already divided by their scales -> the scheme's 8-bit type."""
  limit = scheme.max_value
  if not scheme.is_float:
    x = jnp.round(x)  # half to even, as numpy
  return jnp.clip(x, -limit, limit).astype(jnp.dtype(scheme.weight_dtype))


def scales_of(amax: jax.Array, scheme: QuantScheme) -> jax.Array:
  """float32 scales from the largest magnitudes (1 where a slice is all zeros). Multiplied by the
  float32 reciprocal of the type's maximum, as XLA would rewrite a division by it anyway, so that
  the reference (and a checkpoint written with it) agrees bitwise."""
  inverse = jnp.float32(1.0 / scheme.max_value)
  return jnp.where(amax > 0, amax.astype(jnp.float32) * inverse, 1.0).astype(jnp.float32)


def quantize_weight(kernel: jax.Array, scheme: QuantScheme) -> tuple[jax.Array, jax.Array]:
  """kernel [out, in] (Hugging Face's layout) -> (q [out, in] in scheme.weight_dtype,
  scale float32[out]), one scale per row: kernel ~= q * scale[:, None]."""
  _check_float("kernel", kernel)
  if kernel.ndim != 2:
    raise ValueError(f"kernel: must be [out, in], got shape {kernel.shape}")
  w = kernel.astype(jnp.float32)
  scale = scales_of(jnp.max(jnp.abs(w), axis=1), scheme)
  return to_quantized(w * (1.0 / scale)[:, None], scheme), scale


def quantize_rows(x: jax.Array, scheme: QuantScheme) -> tuple[jax.Array, jax.Array]:
  """Activations [..., K] -> (q [..., K] in scheme.weight_dtype, scale float32[...]), one scale
  per token (dynamic: computed from the step's own values)."""
  _check_float("x", x)
  x32 = x.astype(jnp.float32)
  scale = scales_of(jnp.max(jnp.abs(x32), axis=-1), scheme)
  return to_quantized(x32 * (1.0 / scale)[..., None], scheme), scale
