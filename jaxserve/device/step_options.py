"""How the step programs compile on this machine, from EngineConfig: XLA options (gpu_gemm) and
the sampler's greedy pick (sampler_backend, step_greedy), decided by the config's typed kernel
choices (EngineConfig.kernels, config/kernel_choices.py), never by comparing their names.
jaxserve/composition/assembly.py and the ahead-of-time TPU build (jaxserve/tpu_aot) hand both to
build_step_programs."""

from __future__ import annotations

import functools

import jax

from jaxserve.config import EngineConfig, KernelChoice
from jaxserve.device.fixed_order_greedy import fixed_order_greedy
from jaxserve.device.sampler import GreedyFn, xla_greedy
from jaxserve.quantization.scheme import NONE, scheme_for
from pallas_kernels.greedy_sample.gpu import greedy_sample

BATCH_INVARIANT_OPTIONS = {"xla_allow_excess_precision": False}
BATCH_INVARIANT_GPU_OPTIONS = {"xla_gpu_enable_triton_gemm": False, "xla_gpu_autotune_level": 0}


def step_compiler_options(
  config: EngineConfig, quantization: str = NONE
) -> dict[str, object] | None:
  """XLA options of the step programs of a model running the weight scheme `quantization`: on
  GPUs with gpu_gemm "cublas" or "cublaslt", no Triton GEMM fusions, and with "cublaslt" GEMMs
  called through cuBLASLt; except for weight-only schemes (int8, fp8_w8a16), whose GEMMs only
  XLA's Triton fusions run without first writing a converted copy of the weight. batch_invariant:
  no excess precision (a bfloat16 rounding skipped or not by how ops fuse), and on GPUs no
  Triton GEMMs and no timing-based autotuning (one algorithm per GEMM shape in every
  compilation)."""
  on_gpu = jax.default_backend() == "gpu"
  options: dict[str, object] = {}
  scheme = scheme_for(quantization)
  weight_only = scheme is not None and not scheme.quantize_activations
  gemm = config.kernels.gpu_gemm
  if on_gpu and not gemm.keeps_triton_gemms and not weight_only:
    options["xla_gpu_enable_triton_gemm"] = False
    if gemm.through_cublaslt:
      options["xla_gpu_enable_cublaslt"] = True
  if config.batch_invariant:
    options.update(BATCH_INVARIANT_OPTIONS)
    if on_gpu:
      options.update(BATCH_INVARIANT_GPU_OPTIONS)
  return options or None


SAMPLER_WHERE = {
  KernelChoice.PALLAS_GPU: "the Pallas GPU kernel",
  KernelChoice.XLA: "XLA reductions",
}


def describe_step_choices(sampler: KernelChoice, options: dict[str, object] | None) -> str:
  """What the sampler (resolved) and GEMM settings mean for this run, with the config key to
  change each."""
  text = f"greedy picks and logprobs: {SAMPLER_WHERE[sampler]} (sampler_backend={sampler.value})"
  if options:
    gemms = "cuBLASLt" if options.get("xla_gpu_enable_cublaslt") else "cuBLAS"
    text += f"; GEMMs: {gemms}, XLA's Triton GEMM fusions off (gpu_gemm)"
  return text


def sampler_backend(config: EngineConfig, sharded: bool) -> KernelChoice:
  """EngineConfig.sampler_backend with AUTO resolved: the Pallas kernel for unsharded models
  on GPUs, XLA elsewhere."""
  chosen = config.kernels.sampler
  if chosen is not KernelChoice.AUTO:
    return chosen
  on_gpu = jax.default_backend() == "gpu"
  return KernelChoice.PALLAS_GPU if on_gpu and not sharded else KernelChoice.XLA


def greedy_sampler(backend: KernelChoice) -> GreedyFn:
  """The sampler's greedy pick and log-normalizer for a resolved sampler backend (the Pallas
  kernel runs in interpret mode off a GPU)."""
  if backend is KernelChoice.XLA:
    return xla_greedy
  return functools.partial(greedy_sample, interpret=jax.default_backend() != "gpu")


def step_greedy(config: EngineConfig, sharded: bool) -> GreedyFn:
  """The greedy pick the step programs compile with: sharded steps reduce with XLA (the
  sampler's reductions over a sharded vocabulary), unsharded ones with sampler_backend's.
  batch_invariant: XLA's reductions become the fixed-order ones (the Pallas kernel reduces
  each row in a fixed order already)."""
  backend = KernelChoice.XLA if sharded else sampler_backend(config, sharded=False)
  if backend is KernelChoice.XLA and config.batch_invariant:
    return fixed_order_greedy
  return greedy_sampler(backend)
