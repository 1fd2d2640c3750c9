"""The step's XLA options follow EngineConfig.gpu_gemm on GPUs and are empty elsewhere."""
from __future__ import annotations

import jax

from jaxserve.config import EngineConfig
from jaxserve.engine.factory import step_compiler_options


def test_gpu_gemm_options():
  on_gpu = jax.default_backend() == "gpu"
  expected = {"xla_gpu_enable_triton_gemm": False} if on_gpu else None
  assert step_compiler_options(EngineConfig()) == expected
  assert step_compiler_options(EngineConfig(gpu_gemm="xla")) is None
