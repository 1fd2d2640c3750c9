"""Pure-jnp references of the quantized matmul. quantized_matmul_reference: weight-only, x [M, K]
times the 8-bit kernel w [N, K] converted to x's dtype, float32 accumulation, times scale [N],
rounded once to x's dtype. quantized_matmul_fp8x_reference: the quantize_x arithmetic, x
quantized to float8_e4m3fn per row and group of `group` values of K (scale: the group's largest
magnitude / 448; below 2**-120 the group is zeros), each group's fp8 dot times its scale,
summed, times scale [N]. The kernel's values match them to rounding (it sums K in its own
order)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

FP8_MAX = 448.0
MIN_X_SCALE = 2.0**-120  # a smaller group scale quantizes the group to zeros


def quantized_matmul_reference(x: jax.Array, w: jax.Array, scale: jax.Array) -> jax.Array:
  acc = jnp.dot(
    x.astype(jnp.float32), w.astype(jnp.float32).T, precision=jax.lax.Precision.HIGHEST
  )  # [M, N]
  return (acc * scale.astype(jnp.float32)).astype(x.dtype)


def quantized_matmul_fp8x_reference(
  x: jax.Array, w: jax.Array, scale: jax.Array, group: int = 128
) -> jax.Array:
  (m, k), n = x.shape, w.shape[0]
  xg = x.astype(jnp.float32).reshape(m, k // group, group)  # [M, G, group]
  x_scale = jnp.max(jnp.abs(xg), axis=-1) / FP8_MAX  # [M, G]
  inverse = jnp.where(
    x_scale >= MIN_X_SCALE, 1.0 / jnp.maximum(x_scale, MIN_X_SCALE), 0.0
  )  # [M, G]
  xq = jnp.clip(xg * inverse[..., None], -FP8_MAX, FP8_MAX)  # [M, G, group]
  xq = xq.astype(jnp.float8_e4m3fn).astype(jnp.float32)  # [M, G, group], rounded to e4m3
  wg = w.astype(jnp.float32).reshape(n, k // group, group)  # [N, G, group]
  per_group = jnp.einsum("mgk,ngk->mng", xq, wg, precision=jax.lax.Precision.HIGHEST)  # [M, N, G]
  acc = jnp.sum(per_group * x_scale[:, None, :], axis=-1)  # [M, N]
  return (acc * scale.astype(jnp.float32)).astype(x.dtype)
