"""The 8-bit KV cache format every write and attention variant shares.

Pages of dtype float8_e4m3fn or int8 hold K (V) divided by one static float scale per layer
and tensor: k_scale for K, v_scale for V (vLLM's k_scale / v_scale; 1.0 unless calibrated). A
value is stored as

  fp8:  float8_e4m3fn(clip(x / scale, -448, 448))       (round to nearest even)
  int8: int8(clip(round(x / scale), -127, 127))         (symmetric, round half to even)

and read back as float32(stored) * scale. Float pages (float32, bfloat16) take no scale (1.0).

Why one static scale (docs/DECISIONS.md, "An 8-bit KV cache with static scales"): the
page arrays keep their shape and the KV pool its structure (no scale arrays to allocate, shard,
donate or gather), the write is an elementwise quantize of the step's new rows, and the attention
kernels fold k_scale into the softmax scale and v_scale into the output: the read costs nothing
but the 8-bit load and a cast.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

FP8_MAX = float(jnp.finfo(jnp.float8_e4m3fn).max)  # 448
INT8_MAX = 127.0
QUANTIZED_KV_DTYPES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.int8))


def is_quantized(dtype) -> bool:
  """True for the 8-bit page dtypes (float8_e4m3fn, int8)."""
  return jnp.dtype(dtype) in QUANTIZED_KV_DTYPES


def check_scales(pages_dtype, k_scale: float, v_scale: float, where: str) -> None:
  """Raises ValueError unless both scales are finite and > 0, and 1.0 for float pages."""
  for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
      raise ValueError(f"{where}: {name}: must be a finite float > 0, got {scale!r}")
    if not is_quantized(pages_dtype) and scale != 1.0:
      raise ValueError(
        f"{where}: {name}: {scale} given for {jnp.dtype(pages_dtype)} pages "
        "(scales apply to float8_e4m3fn and int8 pages only)"
      )


def quantize_kv(x: jax.Array, dtype, scale: float) -> jax.Array:
  """x (any float shape) -> `dtype` pages' values: x / scale as the format above stores it; a
  float dtype is a plain cast."""
  dtype = jnp.dtype(dtype)
  if not is_quantized(dtype):
    return x.astype(dtype)
  y = x.astype(jnp.float32) / scale
  if dtype == jnp.int8:
    return jnp.clip(jnp.round(y), -INT8_MAX, INT8_MAX).astype(jnp.int8)
  return jnp.clip(y, -FP8_MAX, FP8_MAX).astype(dtype)


def dequantize_kv(x: jax.Array, scale: float) -> jax.Array:
  """Stored values (any dtype) -> float32 values: float32(x) * scale."""
  return x.astype(jnp.float32) * scale
