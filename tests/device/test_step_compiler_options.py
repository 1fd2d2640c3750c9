"""The step's XLA options follow EngineConfig.gpu_gemm on GPUs (weight-only quantized models
keep XLA's Triton GEMMs) and are empty elsewhere; the
sampler backend follows EngineConfig.sampler_backend."""

from __future__ import annotations

import jax
import pytest

from jaxserve.config import EngineConfig, KernelChoice
from jaxserve.device.sampler import xla_greedy
from jaxserve.device.step_options import greedy_sampler, sampler_backend, step_compiler_options


def test_gpu_gemm_options():
  on_gpu = jax.default_backend() == "gpu"
  no_triton = {"xla_gpu_enable_triton_gemm": False}
  expected_lt = {**no_triton, "xla_gpu_enable_cublaslt": True} if on_gpu else None
  assert step_compiler_options(EngineConfig()) == (no_triton if on_gpu else None)
  assert step_compiler_options(EngineConfig(gpu_gemm="cublaslt")) == expected_lt
  assert step_compiler_options(EngineConfig(gpu_gemm="xla")) is None
  # W8A8 schemes keep cuBLAS(Lt); weight-only ones need XLA's Triton GEMMs to read 8-bit weights
  assert step_compiler_options(EngineConfig(), "fp8") == (no_triton if on_gpu else None)
  assert step_compiler_options(EngineConfig(), "int8") is None
  assert step_compiler_options(EngineConfig(gpu_gemm="cublaslt"), "fp8_w8a16") is None


def test_sampler_backend_resolution():
  on_gpu = jax.default_backend() == "gpu"
  pallas, xla = KernelChoice.PALLAS_GPU, KernelChoice.XLA
  assert sampler_backend(EngineConfig(), sharded=False) is (pallas if on_gpu else xla)
  assert sampler_backend(EngineConfig(), sharded=True) is xla
  assert sampler_backend(EngineConfig(sampler_backend="pallas_gpu"), sharded=False) is pallas
  assert sampler_backend(EngineConfig(sampler_backend="xla"), sharded=False) is xla
  assert greedy_sampler(xla) is xla_greedy
  assert greedy_sampler(pallas).keywords == {"interpret": not on_gpu}


@pytest.mark.parametrize(
  "changes,field",
  [
    ({"sampler_backend": "triton"}, "sampler_backend"),
    ({"sampler_backend": "pallas_gpu", "tensor_parallel_size": 2}, "sampler_backend"),
    ({"gpu_gemm": "cutlass"}, "gpu_gemm"),
  ],
)
def test_bad_values_name_the_field(changes, field):
  with pytest.raises(ValueError, match=field):
    EngineConfig(**changes)
