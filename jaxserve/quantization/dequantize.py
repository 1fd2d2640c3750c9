"""Dequantizing a stored 8-bit weight on the device: q [out, in] (e4m3 or int8) times its scales,
each scale covering a block of `block` = (rows, cols) of the weight, the last row / column of
blocks partial where the block does not divide the weight (block-wise fp8: (128, 128); a
per-channel scale [out, 1]: (1, in); one scale for the tensor: (out, in)). In float32, as
transformers' Fp8Dequantize computes it (float(q) * scale)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dequantize(q: jax.Array, scale: jax.Array, block: tuple[int, int]) -> jax.Array:
  """q [out, in] and scale [ceil(out / rows), ceil(in / cols)] (or any shape of as many values)
  -> float32 [out, in]."""
  out, inner = q.shape
  rows, cols = block
  grid = (-(-out // rows), -(-inner // cols))
  s = scale.astype(jnp.float32).reshape(grid)
  s = jnp.repeat(jnp.repeat(s, rows, axis=0), cols, axis=1)[:out, :inner]
  return q.astype(jnp.float32) * s
