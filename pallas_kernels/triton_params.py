"""Triton compiler parameters for every Pallas GPU kernel of this package, across JAX versions
(plgpu.CompilerParams, formerly plgpu.TritonCompilerParams)."""

from __future__ import annotations

from jax.experimental.pallas import triton as plgpu


def triton_compiler_params(num_warps: int, num_stages: int):
  """Triton's num_warps and num_stages as the installed JAX's compiler-params class."""
  params_cls = getattr(plgpu, "CompilerParams", None) or plgpu.TritonCompilerParams
  return params_cls(num_warps=num_warps, num_stages=num_stages)
