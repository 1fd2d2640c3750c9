"""The engine's decode-burst program (scheduler.num_scheduler_steps > 1) with the Pallas kernels
lowers for CUDA and for TPU on a machine with neither: the whole model with its KV-write and
attention kernels, inside the burst's loop."""

from __future__ import annotations

import contextlib
import dataclasses
import re

import pytest

from jaxserve.composition.assembly import build_device
from jaxserve.device.lowering import dummy_inputs
from jaxserve.device.packing import pack
from jaxserve.device.sampler import SamplerMode
from jaxserve.messages.buckets import Bucket
from tests.integration.engine_helpers import small_config
from tests.pallas_kernels.test_gpu_lowering import TRITON_CALL_TARGET, _target_gpu
from tests.pallas_kernels.test_tpu_lowering import MOSAIC_CUSTOM_CALL


@pytest.mark.parametrize(
  "platform,backend,target",
  [("cuda", "pallas_gpu", TRITON_CALL_TARGET), ("tpu", "pallas_tpu", MOSAIC_CUSTOM_CALL)],
)
def test_burst_lowers_with_the_pallas_kernels(platform, backend, target):
  config = small_config(
    attention_backend=backend, num_scheduler_steps=4, seq_buckets=(8,), token_buckets=(8, 64)
  )
  runner = build_device(config).runner
  inputs = dummy_inputs(runner, Bucket(8, 8), SamplerMode(random=True))
  args = (
    runner.params,
    runner.kv_pages,
    pack(dataclasses.replace(inputs, sampling=None)),
    pack(inputs.sampling),
    SamplerMode(random=True),
  )
  with _target_gpu() if platform == "cuda" else contextlib.nullcontext():
    text = runner.programs.burst.trace(*args).lower(lowering_platforms=(platform,)).as_text()
  assert re.search(r"stablehlo\.while", text)
  # the KV write and the attention kernel (each a function every layer calls)
  assert len(re.findall(rf"custom_call @{re.escape(target)}\(", text)) >= 2
