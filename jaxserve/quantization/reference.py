"""Pure-numpy references of quantize.py and matmul.py (ml_dtypes gives numpy the e4m3 type and
its round-to-nearest-even conversion): the ground truth of tests/quantization and of the
compressed-tensors checkpoints the tests write. Kernels are [out, in], as matmul.py stores them
(K contiguous: cuBLASLt's fp8 / int8 GEMMs take only that "TN" layout). Products are computed in
float64."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from jaxserve.quantization.scheme import QuantScheme

NUMPY_DTYPES = {"float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn), "int8": np.dtype(np.int8)}


def to_quantized(x: np.ndarray, scheme: QuantScheme) -> np.ndarray:
  limit = np.float32(scheme.max_value)
  x = np.asarray(x, np.float32)
  if not scheme.is_float:
    x = np.round(x)
  return np.clip(x, -limit, limit).astype(NUMPY_DTYPES[scheme.weight_dtype])


def scales_of(amax: np.ndarray, scheme: QuantScheme) -> np.ndarray:
  amax = np.asarray(amax, np.float32)
  inverse = np.float32(1.0 / scheme.max_value)
  return np.where(amax > 0, amax * inverse, np.float32(1)).astype(np.float32)


def quantize_weight(kernel: np.ndarray, scheme: QuantScheme) -> tuple[np.ndarray, np.ndarray]:
  """kernel [out, in] -> (q [out, in], scale float32[out]), per output channel (row)."""
  w = np.asarray(kernel, np.float32)
  scale = scales_of(np.abs(w).max(axis=1), scheme)
  return to_quantized(w * (np.float32(1) / scale)[:, None], scheme), scale


def quantize_rows(x: np.ndarray, scheme: QuantScheme) -> tuple[np.ndarray, np.ndarray]:
  """x [..., K] -> (q [..., K], scale float32[...]), per row."""
  x = np.asarray(x, np.float32)
  scale = scales_of(np.abs(x).max(axis=-1), scheme)
  return to_quantized(x * (np.float32(1) / scale)[..., None], scheme), scale


def dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
  """q [out, in] * scale [out] (per row) in float64, [out, in]."""
  return q.astype(np.float64) * np.asarray(scale, np.float64)[:, None]


def quantized_matmul(
  x: np.ndarray, q: np.ndarray, scale: np.ndarray, scheme: QuantScheme
) -> np.ndarray:
  """What matmul.quantized_matmul computes, in float64 (x as given, before any cast):
  x [..., in] with q [out, in] -> [..., out]."""
  if not scheme.quantize_activations:
    return np.asarray(x, np.float64) @ dequantize(q, scale).T
  xq, x_scale = quantize_rows(x, scheme)
  return (xq.astype(np.float64) @ q.astype(np.float64).T) * (
    x_scale.astype(np.float64)[..., None] * np.asarray(scale, np.float64)
  )
