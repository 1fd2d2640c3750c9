"""Quantized projections: the flax module every q/k/v/o and MLP projection is when
ModelConfig.quantization names a scheme (jaxserve/quantization/scheme.py), and the one rule of
which params leaves are quantized.

A quantized projection's params are `kernel` [out, in] in the scheme's 8-bit type (int8 or
float8_e4m3fn) and `scale` float32[out], one per output channel (plus `bias` in the model dtype
where the projection has one); merged projections (models/fused_projections.py) concatenate
all of them along out, axis 0 (`output_axis`). The kernel is [out, in] (K contiguous, Hugging
Face's layout, unlike a float Dense's [in, out]) because cuBLASLt's fp8 and int8 GEMMs take only
the "TN" layout, so XLA would otherwise transpose every weight in every step (docs/DECISIONS.md,
"Quantized GEMMs"); this module is that rule's one owner (`kernel_shape`, `output_axis`).
Shapes and dtypes depend on the config alone, so a quantized model compiles each step program
once, as the unquantized one. The GEMM is jaxserve/quantization/matmul.py's; with
`small_batch_kernel` KernelChoice.PALLAS_GPU, a call of at most 16 rows (a decode step) runs
instead on pallas_kernels/quantized_matmul, which reads the 8-bit kernel in place: the fp8 W8A8
scheme quantizes x there too (one e4m3 scale per token and 128 values of K, finer than the
larger steps' one per token) and multiplies on fp8 operands; the other schemes compute
weight-only (x in the model's dtype, float32 accumulation, then the scale: int8_w8a8's
activations are quantized only in larger steps). Embeddings, norms and lm_head are never quantized.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxserve.config.kernel_choices import KernelChoice
from jaxserve.models.fp8_experts import SCALE_SUFFIX, quantize_experts
from jaxserve.models.moe_config import expert_quantization
from jaxserve.quantization.matmul import quantized_matmul
from jaxserve.quantization.quantize import quantize_weight
from jaxserve.quantization.scheme import QuantScheme
from pallas_kernels.quantized_matmul import gpu as small_batch

ParamPath = tuple[str, ...]
PROJECTION_MODULES = ("self_attn", "mlp")


def is_quantized_kernel(path: ParamPath) -> bool:
  """Whether a params leaf is a projection kernel a quantized model stores in 8 bits:
  layers_{i}/{self_attn,mlp}/<name>_proj/kernel (lm_head and the embedding are not)."""
  return (
    len(path) == 4
    and path[0].startswith("layers_")
    and path[1] in PROJECTION_MODULES
    and path[2].endswith("_proj")
    and path[3] == "kernel"
  )


def scale_path(kernel_path: ParamPath) -> ParamPath:
  return kernel_path[:-1] + ("scale",)


def kernel_shape(in_features: int, out_features: int) -> tuple[int, int]:
  """A quantized kernel's shape: [out, in] (the module docstring says why)."""
  return (out_features, in_features)


def output_axis(projection: Mapping[str, object]) -> int:
  """The axis of a projection's leaves along which its output channels lie (merged projections
  concatenate along it): 0 for every leaf of a quantized one (kernel [out, in], scale and bias
  [out]; it has a `scale`), the last for a float Dense (kernel [in, out], bias [out])."""
  return 0 if "scale" in projection else -1


class QuantizedDense(nn.Module):
  """y = x @ (kernel * scale) [+ bias], in `dtype`, as `scheme` computes it (calls of at most
  16 rows with small_batch_kernel PALLAS_GPU: on the Pallas kernel, the module docstring)."""

  features: int
  dtype: jnp.dtype
  scheme: QuantScheme
  use_bias: bool = False
  small_batch_kernel: KernelChoice = KernelChoice.XLA  # ModelConfig.quantized_gemm

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param(
      "kernel",
      nn.initializers.zeros_init(),
      kernel_shape(x.shape[-1], self.features),
      jnp.dtype(self.scheme.weight_dtype),
    )
    scale = self.param("scale", nn.initializers.ones_init(), (self.features,), jnp.float32)
    x = x.astype(self.dtype)
    rows = math.prod(x.shape[:-1])
    quantize_x = self.scheme.quantize_activations and self.scheme.is_float
    if self.small_batch_kernel is KernelChoice.PALLAS_GPU and small_batch.supports(
      rows, *kernel.shape, quantize_x
    ):
      y = small_batch.quantized_matmul(
        x.reshape(rows, x.shape[-1]),
        kernel,
        scale,
        quantize_x=quantize_x,
        interpret=jax.default_backend() != "gpu",
      ).reshape(*x.shape[:-1], self.features)
    else:
      y = quantized_matmul(x, kernel, scale, self.scheme)
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,), self.dtype)
    return y


def quantize_params(params: dict, scheme: QuantScheme) -> dict:
  """Every projection kernel of a float params tree (fused or not; flax [in, out]) replaced, in
  place, by its 8-bit kernel [out, in] and scale, and with the fp8 scheme a MoE's experts by fp8
  experts (models/moe_config.py); returns `params`. One layer's projections at a
  time, so only the tree's own references keep the float kernels alive."""
  quantize = jax.jit(lambda kernel: quantize_weight(kernel.T, scheme))
  experts_fp8 = expert_quantization(scheme.name, False) == "fp8_channel"
  for layer, modules in params.items():
    for module, projections in modules.items() if isinstance(modules, dict) else ():
      for name, leaves in projections.items() if isinstance(projections, dict) else ():
        if is_quantized_kernel((layer, module, name, "kernel")) and "kernel" in leaves:
          leaves = dict(leaves)
          leaves["kernel"], leaves["scale"] = quantize(leaves["kernel"])
          projections[name] = leaves
        elif experts_fp8 and module == "mlp" and name == "experts":
          projections[name] = _quantized_experts(leaves)
  return params


def _quantized_experts(leaves: Mapping[str, jax.Array]) -> dict:
  """A MoE layer's float experts ([E, in, out] each) -> fp8 per-channel weights [E, out, in] and
  `<projection>_scale` leaves (models/fp8_experts.py)."""
  quantize = jax.jit(quantize_experts)
  out = {}
  for name, kernel in leaves.items():
    q = quantize(kernel)
    out[name], out[name + SCALE_SUFFIX] = q.weight, q.scale
  return out
