"""A greedy request gives the same tokens alone and inside a crowd, with chunked prefill on and
preemption forced by a tiny KV pool."""

from __future__ import annotations

import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from tests.integration.engine_helpers import run_to_completion, small_engine

PROBE_PROMPT = list(range(60, 60 + 37))  # spans a few pages and several prefill chunks
PROBE_PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _probe_alone() -> tuple[int, ...]:
  engine = small_engine(num_pages=128, max_tokens_per_step=64)
  engine.add_request(PROBE_PROMPT, PROBE_PARAMS, request_id="probe")
  return run_to_completion(engine)["probe"].token_ids


def test_greedy_tokens_identical_alone_and_in_crowd_with_preemption():
  alone = _probe_alone()
  # 16-token prefill chunks and a pool of 24 usable pages for 33 requests force preemption.
  engine = small_engine(
    num_pages=25, max_tokens_per_step=16, token_buckets=(8, 16), prefix_caching=False
  )
  rng = np.random.default_rng(0)
  for i in range(16):
    prompt = rng.integers(1, 256, size=int(rng.integers(1, 80))).tolist()
    engine.add_request(
      prompt,
      SamplingParams(
        temperature=float(rng.choice([0.0, 0.8])),
        max_tokens=int(rng.integers(20, 60)),
        ignore_eos=True,
      ),
      request_id=f"other-{i}",
    )
  engine.add_request(PROBE_PROMPT, PROBE_PARAMS, request_id="probe")
  for i in range(16, 32):
    prompt = rng.integers(1, 256, size=int(rng.integers(1, 80))).tolist()
    engine.add_request(
      prompt,
      SamplingParams(temperature=0.0, max_tokens=int(rng.integers(20, 60)), ignore_eos=True),
      request_id=f"other-{i}",
    )
  finished = run_to_completion(engine)
  assert len(finished) == 33
  assert engine.stats().num_preemptions > 0, "the pool was meant to force preemption"
  assert finished["probe"].token_ids == alone
  assert engine.stats().num_used_pages == 0


def test_seeded_sampling_identical_whatever_the_batch_mates():
  params = SamplingParams(
    temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=20, ignore_eos=True
  )
  engine = small_engine()
  engine.add_request(PROBE_PROMPT, params, request_id="alone")
  alone = run_to_completion(engine)["alone"].token_ids
  rng = np.random.default_rng(1)
  for i in range(7):
    engine.add_request(
      rng.integers(1, 256, size=10).tolist(),
      SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True),
      request_id=f"mate-{i}",
    )
  engine.add_request(PROBE_PROMPT, params, request_id="crowd")
  assert run_to_completion(engine)["crowd"].token_ids == alone
