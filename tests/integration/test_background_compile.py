"""Serving while compiling (warmup "background", here on three compile threads): the engine
starts once the largest bucket and the smallest decode bucket are compiled and pads every step to
the smallest bucket compiled so far. Its requests, which land in
buckets not compiled yet (padded to a larger one), get the same tokens and logprobs as on a fully
warmed engine; its compile ledger reaches every program (the same count as the full warmup) and
then stays flat whatever the workload; the bucket pick runs on the host (engine/llm_engine.py)."""

from __future__ import annotations

import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.messages.buckets import Bucket
from tests.integration.engine_helpers import run_to_completion, small_engine

CONFIG = dict(
  num_pages=128,
  max_num_seqs=8,
  seq_buckets=(2, 8),
  token_buckets=(8, 16, 64),
  max_tokens_per_step=64,
  max_model_len=256,
)


def _workload(seed: int) -> list[tuple[list[int], SamplingParams]]:
  rng = np.random.default_rng(seed)
  kinds = [
    dict(temperature=0.0),
    dict(temperature=0.8, top_p=0.9, seed=7),
    dict(temperature=0.0, logprobs=2, prompt_logprobs=1),
    dict(temperature=0.7, repetition_penalty=1.2, seed=3),
  ]
  return [
    (
      rng.integers(1, 256, size=int(rng.integers(1, 40))).tolist(),
      SamplingParams(max_tokens=int(rng.integers(2, 12)), ignore_eos=True, **kinds[i % 4]),
    )
    for i in range(10)
  ]


def _run(engine, workload, tag: str) -> dict:
  for i, (prompt, params) in enumerate(workload):
    engine.add_request(prompt, params, request_id=f"{tag}-{i}")
  done = run_to_completion(engine)
  return {rid.split("-", 1)[1]: out for rid, out in done.items()}


def _logprobs(output) -> list[float]:
  return [e.logprob for e in output.logprobs or ()]


def test_requests_in_uncompiled_buckets_match_a_warm_engine():
  engine = small_engine(warmup="background", compile_threads=3, **CONFIG)
  at_start = engine.ledger.num_compilations
  first = engine.programs.readiness()
  assert first.steps == frozenset({Bucket(8, 64), Bucket(2, 8)})
  assert first.num_compiled < first.num_total and first.finished_after_s is None
  got = _run(engine, _workload(0), "a")
  padded_steps = engine.timings.per_bucket[(8, 64)][0]
  assert engine.programs.wait(timeout=600)
  done = engine.programs.readiness()
  assert done.num_compiled == done.num_total == first.num_total
  assert done.steps == frozenset(engine.runner.buckets.all()) and done.finished_after_s > 0
  assert engine.stats().num_programs_compiled == engine.stats().num_programs_total == done.num_total
  compiled = engine.ledger.num_compilations
  # every program the compile thread compiled is counted (a compilation or a cache load)
  assert compiled - at_start >= done.num_total - first.num_compiled
  again = _run(engine, _workload(1), "b")
  assert len(again) == 10 and engine.ledger.num_compilations == compiled
  engine.ledger.close()

  full = small_engine(warmup="full", **CONFIG)
  assert full.programs.readiness().num_compiled == done.num_total
  expected = _run(full, _workload(0), "a")
  full.ledger.close()
  # steps that fitted a smaller bucket, not compiled yet, ran padded to the largest
  assert padded_steps > full.timings.per_bucket.get((8, 64), [0])[0]
  for key, out in expected.items():
    assert got[key].token_ids == out.token_ids, key
    np.testing.assert_allclose(_logprobs(got[key]), _logprobs(out), rtol=1e-5, atol=1e-5)
