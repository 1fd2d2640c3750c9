"""The kernels a configuration chooses by name, as typed values: each key's strings stay the
user-facing values (YAML, --set, the engine arguments' choices) and are parsed once, by
EngineConfig.kernels, into an enum whose members carry what callers decide by; no caller compares
a kernel's name.

  attention_backend  AttentionChoice: the platform a backend needs (`platform`) and the page
                     sizes whose 8-bit KV pages it reads (`kv_8bit_page_sizes`); what a built
                     backend does is attention/capabilities.py's BackendCapabilities, whose
                     BackendKind values are these names less "auto"
  gpu_gemm           GpuGemm: whether XLA's Triton GEMM fusions stay, whether GEMMs go through
                     cuBLASLt
  sampler_backend,   KernelChoice: auto, XLA ops or the Pallas GPU kernel; `unsharded_only`
  quantized_gemm     (the Pallas kernels run on unsharded models); "auto" is resolved by the
                     device side (device/step_options.sampler_backend,
                     parallel/placement.quantized_gemm) into XLA or PALLAS_GPU
No jax.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# The page sizes whose 8-bit pages the Pallas TPU kernel reads: a page is whole 32-row tiles of
# 8-bit data (pallas_kernels/ragged_paged_attention/tpu/attention.py; its own check is at the call).
TPU_8BIT_KV_PAGE_SIZES = (32, 64)


class AttentionChoice(enum.Enum):
  """attention_backend: "auto" picks by JAX's platform (attention/backends.py)."""

  AUTO = "auto"
  REFERENCE = "reference"
  XLA = "xla"
  PALLAS_GPU = "pallas_gpu"
  PALLAS_TPU = "pallas_tpu"

  @property
  def platform(self) -> str | None:
    """The device platform the backend runs on natively (None: any)."""
    return {AttentionChoice.PALLAS_GPU: "gpu", AttentionChoice.PALLAS_TPU: "tpu"}.get(self)

  @property
  def kv_8bit_page_sizes(self) -> tuple[int, ...] | None:
    """The page sizes of the 8-bit KV pages it reads (None: any)."""
    return TPU_8BIT_KV_PAGE_SIZES if self is AttentionChoice.PALLAS_TPU else None


class GpuGemm(enum.Enum):
  """gpu_gemm: how a step's GEMMs compile on GPUs (config/engine.py's EngineConfig says why)."""

  CUBLAS = "cublas"
  CUBLASLT = "cublaslt"
  XLA = "xla"

  @property
  def keeps_triton_gemms(self) -> bool:
    """XLA's Triton GEMM fusions stay on (XLA chooses)."""
    return self is GpuGemm.XLA

  @property
  def through_cublaslt(self) -> bool:
    return self is GpuGemm.CUBLASLT


class KernelChoice(enum.Enum):
  """sampler_backend and quantized_gemm: XLA's ops or the Pallas GPU kernel ("auto": resolved
  on the device side)."""

  AUTO = "auto"
  XLA = "xla"
  PALLAS_GPU = "pallas_gpu"

  @property
  def unsharded_only(self) -> bool:
    """The Pallas GPU kernels run on unsharded models only (tensor_parallel_size 1)."""
    return self is KernelChoice.PALLAS_GPU


def values(choice: type[enum.Enum]) -> tuple[str, ...]:
  """The config's strings for an enum of choices, in declaration order."""
  return tuple(member.value for member in choice)


@dataclass(frozen=True)
class KernelChoices:
  """EngineConfig's kernel keys, parsed (EngineConfig.kernels)."""

  attention: AttentionChoice
  gpu_gemm: GpuGemm
  sampler: KernelChoice
  quantized_gemm: KernelChoice
