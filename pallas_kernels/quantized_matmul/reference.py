"""Pure-jnp reference of the weight-only quantized matmul: x [M, K] times the 8-bit kernel
w [N, K] converted to x's dtype, float32 accumulation, times scale [N], rounded once to x's dtype.
The kernel's values match it to rounding (it sums K in its own order)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def quantized_matmul_reference(x: jax.Array, w: jax.Array, scale: jax.Array) -> jax.Array:
  acc = jnp.dot(
    x.astype(jnp.float32), w.astype(jnp.float32).T, precision=jax.lax.Precision.HIGHEST
  )  # [M, N]
  return (acc * scale.astype(jnp.float32)).astype(x.dtype)
