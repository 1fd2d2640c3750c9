"""`quantized_gemm: pallas_gpu` through the engine: the decode steps of an int8 (W8A16) model run
on the Pallas weight-only kernel (pallas_kernels/quantized_matmul, interpret mode on CPU) and
give the greedy tokens and logprobs of the same model on XLA's GEMM (the same arithmetic: the
int8 weight converted to the model's dtype, float32 accumulation, the scale; only the order of
the float32 sums differs), and the choice between them is `auto`'s rule."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.config import EngineConfig
from jaxserve.parallel.placement import quantized_gemm
from jaxserve.sampling_params import SamplingParams
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
  "setting,scheme,platform,expected",
  [
    ("auto", "int8", None, "xla"),  # this suite's CPU
    ("auto", "fp8", "cpu", "xla"),
    ("auto", "fp8", "tpu", "xla"),
    ("auto", "fp8", "gpu", "pallas_gpu"),  # W8A8 too: decode steps compute weight-only
    ("auto", "int8", "gpu", "pallas_gpu"),
    ("auto", "none", "gpu", "xla"),
    ("xla", "fp8", "gpu", "xla"),
    ("pallas_gpu", "fp8", "cpu", "pallas_gpu"),
  ],
)
def test_auto_runs_the_kernel_on_gpus_only(setting, scheme, platform, expected):
  config = EngineConfig(quantized_gemm=setting)
  assert quantized_gemm(config, scheme, platform) == expected
