"""Pure-jnp reference of the fixed-tile matmul: x [M, K] @ w [K, N] with float32 accumulation,
rounded once to out_dtype. Its values match the kernel's to rounding (not bitwise: the kernel sums
K in its own fixed order)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def matmul_reference(x: jax.Array, w: jax.Array, out_dtype: jnp.dtype) -> jax.Array:
  return jnp.dot(
    x.astype(jnp.float32), w.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
  ).astype(out_dtype)  # [M, N]
