"""Decode bursts (scheduler.num_scheduler_steps > 1: several decode steps per dispatch) change how
often the host looks, never what is generated: the same workload with bursts of 4 and without
gives the same tokens, text, finish reasons and logprobs, with and without async scheduling,
and frees every page.

The workload has what a burst must get right: max_tokens that are not a multiple of the burst
(the last steps fall back to single steps), stop strings and stop ids and eos met inside a
burst (the tokens after them are dropped), seeded random sampling (each step of a burst folds
its own sample index into the key), min_tokens (no burst before it is reached), sampled-token
logprobs, a penalized request (no bursts while it runs), requests that arrive mid-run, and
requests that end at max_model_len (the block table's last position) or just before it, whose
last bursts run past their pages.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from tests.integration.engine_helpers import (
  record_steps_per_dispatch,
  run_to_completion,
  small_engine,
)

BURST = 4
MAX_MODEL_LEN = 80  # 5 pages of 16: the block table holds exactly max_model_len positions


def _workload(vocab_size: int) -> list[tuple[str, list[int], SamplingParams]]:
  rng = np.random.default_rng(3)
  kinds = [
    SamplingParams(temperature=0.0, max_tokens=29, ignore_eos=True),
    SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=22, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=tuple(range(1, 512, 9))),
    SamplingParams(temperature=0.0, max_tokens=40, stop=list("aeiou:^!;/")),
    SamplingParams(
      temperature=0.7,
      top_k=30,
      seed=9,
      max_tokens=25,
      min_tokens=9,
      stop_token_ids=(1, 2, 3, 4, 5, 6, 7, 8),
    ),
    SamplingParams(temperature=0.0, max_tokens=17, logprobs=0, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=9),
  ]
  workload = []
  for i in range(14):
    prompt = rng.integers(0, vocab_size, size=int(rng.integers(3, 40))).tolist()
    workload.append((f"r{i}", prompt, kinds[i % len(kinds)]))
  penalized = SamplingParams(temperature=0.0, max_tokens=6, repetition_penalty=1.3, ignore_eos=True)
  workload.append(("penalized", rng.integers(0, vocab_size, size=12).tolist(), penalized))
  for request_id, prompt_len, max_tokens in (("edge", 51, 29), ("near-edge", 50, 27)):
    prompt = rng.integers(0, vocab_size, size=prompt_len).tolist()  # 51 + 29 = MAX_MODEL_LEN
    workload.insert(
      2,
      (request_id, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)),
    )
  return workload


def _run(num_scheduler_steps: int, async_scheduling: bool):
  engine = small_engine(
    num_pages=96,
    max_num_seqs=8,
    seq_buckets=(8,),  # one sequence bucket and two token buckets: few programs to warm up
    token_buckets=(16, 64),
    async_scheduling=async_scheduling,
    num_scheduler_steps=num_scheduler_steps,
    max_model_len=MAX_MODEL_LEN,
    warmup="full",
  )
  compiled = engine.ledger.num_compilations
  steps_per_dispatch = record_steps_per_dispatch(engine)
  workload = _workload(engine.vocab_size)
  for request_id, prompt, params in workload[:8]:
    engine.add_request(prompt, params, request_id=request_id)
  finished = {}
  for _ in range(30):
    for output in engine.step():
      if output.finished:
        finished[output.request_id] = output
  for request_id, prompt, params in workload[8:]:
    engine.add_request(prompt, params, request_id=request_id)
  finished.update(run_to_completion(engine))
  assert engine.stats().num_used_pages == 0 and not engine.has_unfinished_requests()
  assert engine.ledger.num_compilations == compiled
  return finished, steps_per_dispatch


def _summary(output):
  logprobs = None if output.logprobs is None else [e.token_id for e in output.logprobs]
  return output.token_ids, output.text, output.finish_reason, output.stop_reason, logprobs


@pytest.fixture(scope="module")
def runs():
  return {(steps, mode): _run(steps, mode) for steps in (1, BURST) for mode in (False, True)}


def test_bursts_run(runs):
  for mode in (False, True):
    _, single = runs[(1, mode)]
    _, burst = runs[(BURST, mode)]
    assert set(single) == {1}
    assert burst.count(BURST) >= 10 and 1 in burst, burst


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_bursts_generate_exactly_what_single_steps_do(runs, async_scheduling):
  single, _ = runs[(1, async_scheduling)]
  burst, _ = runs[(BURST, async_scheduling)]
  assert single.keys() == burst.keys()
  assert {"stop", "length"} <= {out.finish_reason for out in single.values()}
  for request_id in sorted(single):
    assert _summary(burst[request_id]) == _summary(single[request_id]), request_id
    if single[request_id].logprobs is not None:
      np.testing.assert_allclose(
        [e.logprob for e in burst[request_id].logprobs],
        [e.logprob for e in single[request_id].logprobs],
        atol=1e-4,
      )
