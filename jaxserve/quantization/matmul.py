"""The quantized projection (device side): x [..., K] times a kernel stored as q [N, K] = [out, in]
in 8 bits with per-output-channel float32 scales [N], in x's dtype. One function for every scheme,
checked against reference.py (tests/quantization).

The kernel is [out, in] (K contiguous, Hugging Face's layout) because cuBLASLt's fp8 and int8
GEMMs take only the "TN" layout, so with flax's [in, out] XLA transposed every weight in every step
(docs/DECISIONS.md, "Quantized GEMMs"); x's last axis contracts with the kernel's axis 1:

  W8A16 (fp8_w8a16, int8): dot(x, q.astype(x.dtype)) * scale, float32 accumulation. The convert
    is an operand of the dot, so a backend that fuses converts into its GEMMs reads the 8-bit
    weight only (XLA:CPU does not: it writes a dequantized copy; docs/DECISIONS.md).
  W8A8 fp8: the tokens quantized per row to e4m3 (dynamic scales), one dot_general on e4m3
    operands with float32 accumulation (fp8 tensor cores on Hopper), both scales applied to the
    float32 result.
  W8A8 int8: the same with int8 operands and int32 accumulation (int8 MXU / tensor cores).

Not a Pallas kernel: XLA lowers these dots itself on every platform, so there is no interpret
path to keep; the wrapper validates its operands with a ValueError naming the bad one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.quantization.quantize import quantize_rows
from jaxserve.quantization.scheme import QuantScheme


def check_operands(x: jax.Array, kernel: jax.Array, scale: jax.Array, scheme: QuantScheme) -> None:
  """ValueError naming the first operand that does not fit the scheme or the others."""
  if kernel.dtype != jnp.dtype(scheme.weight_dtype):
    raise ValueError(f"kernel: {scheme.name} stores {scheme.weight_dtype}, got {kernel.dtype}")
  if kernel.ndim != 2:
    raise ValueError(f"kernel: must be [out, in], got shape {kernel.shape}")
  if scale.shape != (kernel.shape[0],) or scale.dtype != jnp.float32:
    raise ValueError(
      f"scale: must be float32[{kernel.shape[0]}] (one per output channel), "
      f"got {scale.dtype}{list(scale.shape)}"
    )
  if x.ndim < 1 or x.shape[-1] != kernel.shape[1]:
    raise ValueError(f"x: last axis must be {kernel.shape[1]} (the kernel's in), got {x.shape}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"x: must be a floating-point array, got {x.dtype}")


def quantized_matmul(
  x: jax.Array, kernel: jax.Array, scale: jax.Array, scheme: QuantScheme
) -> jax.Array:
  """x [..., K] @ (kernel [N, K] * scale [N, None]).T -> [..., N] in x.dtype, as `scheme`
  computes it."""
  check_operands(x, kernel, scale, scheme)
  contract = (((x.ndim - 1,), (1,)), ((), ()))  # x's K with the kernel's K (axis 1): "TN"
  if not scheme.quantize_activations:
    acc = jax.lax.dot_general(
      x, kernel.astype(x.dtype), contract, preferred_element_type=jnp.float32
    )
    return (acc * scale).astype(x.dtype)
  xq, x_scale = quantize_rows(x, scheme)
  accumulate = jnp.float32 if scheme.is_float else jnp.int32
  acc = jax.lax.dot_general(xq, kernel, contract, preferred_element_type=accumulate)
  return (acc.astype(jnp.float32) * x_scale[..., None] * scale).astype(x.dtype)
