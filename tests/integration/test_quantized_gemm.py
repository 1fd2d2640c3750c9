"""`quantized_gemm: pallas_gpu` through the engine: the decode steps of an int8 (W8A16) model run
on the Pallas weight-only kernel (pallas_kernels/quantized_matmul, interpret mode on CPU) and
give the greedy tokens and logprobs of the same model on XLA's GEMM (the same arithmetic: the
int8 weight converted to the model's dtype, float32 accumulation, the scale; only the order of
the float32 sums differs), the arithmetic each scheme's projection runs on the kernel (fp8 W8A8
with x quantized per 128 of K, every other scheme weight-only), and the choice between XLA and
the kernel is `auto`'s rule."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import EngineConfig, KernelChoice
from jaxserve.models.quantized_dense import QuantizedDense
from jaxserve.parallel.placement import quantized_gemm
from jaxserve.quantization.scheme import SCHEMES
from pallas_kernels.quantized_matmul.reference import (
  quantized_matmul_fp8x_reference,
  quantized_matmul_reference,
)
from tests.integration.engine_helpers import run_to_completion, small_engine

PROMPTS = [[1 + i, 7, 30 + i, 4, 5] for i in range(4)]


def _generate(gemm: str) -> dict:
  engine = small_engine(quantization="int8", quantized_gemm=gemm, compilation_cache_dir=None)
  assert engine.runner is not None
  params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
  for i, prompt in enumerate(PROMPTS):
    engine.add_request(prompt, params, request_id=str(i))
  return run_to_completion(engine)


def test_decode_on_the_pallas_kernel_matches_xla():
  xla, pallas = _generate("xla"), _generate("pallas_gpu")
  for key in xla:
    assert pallas[key].token_ids == xla[key].token_ids
    np.testing.assert_allclose(
      [lp.logprob for lp in pallas[key].logprobs],
      [lp.logprob for lp in xla[key].logprobs],
      atol=2e-3,
    )


@pytest.mark.parametrize(
  "scheme,x_quantized", [("fp8", True), ("fp8_w8a16", False), ("int8", False), ("int8_w8a8", False)]
)
def test_each_schemes_projection_runs_its_arithmetic_on_the_kernel(scheme, x_quantized):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 3, 256)) * 5, jnp.float32)  # 6 rows: a decode step
  pallas = KernelChoice.PALLAS_GPU
  dense = QuantizedDense(64, jnp.float32, SCHEMES[scheme], small_batch_kernel=pallas)
  dtype = jnp.dtype(SCHEMES[scheme].weight_dtype)
  kernel = jnp.asarray(np.clip(rng.standard_normal((64, 256)) * 100, -127, 127)).astype(dtype)
  scale = jnp.asarray(rng.random(64) * 0.01 + 1e-3, jnp.float32)
  y = dense.apply({"params": {"kernel": kernel, "scale": scale}}, x)  # [2, 3, 64]
  reference = quantized_matmul_fp8x_reference if x_quantized else quantized_matmul_reference
  expected = reference(x.reshape(6, 256), kernel, scale).reshape(2, 3, 64)
  # the kernel and the reference sum in different orders: bound each output's float32 rounding
  # by a few ulps of the sum of its terms' magnitudes (on one CPU an output of 0.63 whose terms
  # summed to about 800 in magnitude differed by 2.4e-5, past a fixed atol of 1e-5)
  magnitude = (np.abs(np.asarray(x)) @ np.abs(np.asarray(kernel, np.float32)).T) * np.asarray(scale)
  error = np.abs(np.asarray(y) - np.asarray(expected))  # [2, 3, 64]
  assert (error <= 8 * np.finfo(np.float32).eps * magnitude).all(), error.max()
  other = quantized_matmul_reference if x_quantized else quantized_matmul_fp8x_reference
  if dtype == jnp.float8_e4m3fn:  # the two arithmetics differ on these values
    assert not np.allclose(
      np.asarray(y).reshape(6, 64), np.asarray(other(x.reshape(6, 256), kernel, scale))
    )


@pytest.mark.parametrize(
  "setting,scheme,platform,expected",
  [
    ("auto", "int8", None, "xla"),  # this suite's CPU
    ("auto", "fp8", "cpu", "xla"),
    ("auto", "fp8", "tpu", "xla"),
    ("auto", "fp8", "gpu", "pallas_gpu"),  # W8A8 too: x quantized in the kernel
    ("auto", "int8", "gpu", "pallas_gpu"),
    ("auto", "none", "gpu", "xla"),
    ("xla", "fp8", "gpu", "xla"),
    ("pallas_gpu", "fp8", "cpu", "pallas_gpu"),
  ],
)
def test_auto_runs_the_kernel_on_gpus_only(setting, scheme, platform, expected):
  config = EngineConfig(quantized_gemm=setting)
  assert quantized_gemm(config, scheme, platform) is KernelChoice(expected)
