"""The engine's features with quantized weights (fp8 W8A8) over int8 KV pages, on tiny-random:
decode bursts, async scheduling and prefix caching change nothing that is generated. One engine
with all three on against one with all three off (single synchronous steps, no cache), the same
quantized model: every request's tokens, text, finish reason and logprobs are the same, and each
feature is shown to have run (bursts dispatched, the engine async, cached pages reused). The
HTTP server (over fp8 pages: XLA:CPU converts e4m3 slowly, so these engines take int8 ones),
structured outputs, `bench` and `eval` run quantized in tests/server/test_quantized_server.py
and tests/tools/test_quantized_tools.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from tests.integration.engine_helpers import (
  record_steps_per_dispatch,
  run_to_completion,
  small_config,
)

BURST = 4
SHARED = list(range(40, 40 + 48))  # three full pages of 16: served from the cache the second time


def _engine(features: bool):
  from jaxserve.composition.assembly import build_engine

  config = small_config(
    num_pages=64,
    max_num_seqs=8,
    seq_buckets=(8,),
    token_buckets=(64,),
    max_model_len=128,
    prefix_caching=features,
    async_scheduling=features,
    num_scheduler_steps=BURST if features else 1,
    quantization="fp8",
  )
  config = config.replace(cache=dataclasses.replace(config.cache, kv_cache_dtype="int8"))
  return build_engine(config, show_progress=False, default_warmup="lazy")


def _workload() -> list[tuple[str, list[int], SamplingParams]]:
  rng = np.random.default_rng(5)
  kinds = [
    SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True),
    SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=18, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=tuple(range(1, 512, 11))),
    SamplingParams(temperature=0.0, max_tokens=14, logprobs=0, ignore_eos=True),
  ]
  workload = [
    (f"r{i}", rng.integers(0, 256, size=int(rng.integers(3, 40))).tolist(), kinds[i % 4])
    for i in range(8)
  ]
  greedy = SamplingParams(temperature=0.0, max_tokens=21, logprobs=0, ignore_eos=True)
  workload.append(("shared-first", SHARED + [7, 8, 9], greedy))
  return workload


# Sent after the first batch finishes: their prompts start with SHARED, whose pages are cached.
LATER = [
  ("shared-again", SHARED + [7, 8, 9]),
  ("shared-other-tail", SHARED + [200, 201, 202, 203, 204]),
]


def _run(features: bool):
  engine = _engine(features)
  steps = record_steps_per_dispatch(engine)
  reused = []  # pages each prefix lookup found (the real lookup, recorded)
  share = engine.allocator.share

  def recording_share(page_ids):  # a prefix hit takes its references here (engine/kv_groups.py)
    page_ids = list(page_ids)
    reused.append(len(page_ids))
    share(page_ids)

  engine.allocator.share = recording_share
  for request_id, prompt, params in _workload():
    engine.add_request(prompt, params, request_id=request_id)
  finished = run_to_completion(engine)
  greedy = SamplingParams(temperature=0.0, max_tokens=21, logprobs=0, ignore_eos=True)
  for request_id, prompt in LATER:
    engine.add_request(prompt, greedy, request_id=request_id)
  finished.update(run_to_completion(engine))
  assert engine.stats().num_used_pages == 0
  return engine, finished, steps, reused


@pytest.fixture(scope="module")
def runs():
  return {features: _run(features) for features in (False, True)}


def _summary(output):
  logprobs = None if output.logprobs is None else [e.token_id for e in output.logprobs]
  return output.token_ids, output.text, output.finish_reason, logprobs


def test_each_feature_ran(runs):
  plain, _, plain_steps, plain_reused = runs[False]
  engine, _, steps, reused = runs[True]
  for run in (plain, engine):
    assert run.runner.model.config.quantization == "fp8"
    kernel = run.runner.params["layers_0"]["mlp"]["down_proj"]["kernel"]
    assert kernel.dtype.name == "float8_e4m3fn"
  assert plain.runner.kv_pages[0][0].dtype.name == "int8"  # 8-bit pages
  assert set(plain_steps) == {1} and not any(plain_reused)
  assert engine.async_scheduling and not plain.async_scheduling
  assert steps.count(BURST) >= 5, steps
  assert max(reused) >= 3, reused  # a later request found SHARED's three pages


def test_bursts_async_and_prefix_caching_generate_what_plain_steps_do(runs):
  _, plain, _, _ = runs[False]
  _, featured, _, _ = runs[True]
  assert plain.keys() == featured.keys()
  for request_id in sorted(plain):
    assert _summary(featured[request_id]) == _summary(plain[request_id]), request_id
    if plain[request_id].logprobs is not None:
      np.testing.assert_allclose(
        [e.logprob for e in featured[request_id].logprobs],
        [e.logprob for e in plain[request_id].logprobs],
        atol=1e-4,
      )
  assert featured["shared-again"].token_ids == featured["shared-first"].token_ids
