"""scheduler.prefill_first changes which steps run, not what they compute: the engine generates
the default scheduler's greedy tokens (logprobs within float32 noise) for prompts that arrive
while others decode, a chunked prompt included, and leaves no page behind."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from tests.integration.engine_helpers import run_to_completion, small_engine


def _generate(**kwargs) -> dict:
  engine = small_engine(seq_buckets=(8,), token_buckets=(16, 64), **kwargs)
  rng = np.random.default_rng(1)
  lengths = [5, 70, 12, 1, 33, 9]  # 70 > 64 tokens per step: chunked
  params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
  outputs = {}
  for i, length in enumerate(lengths):  # a new prompt every other step
    engine.add_request(
      rng.integers(0, engine.vocab_size, length).tolist(), params, request_id=f"r{i}"
    )
    for _ in range(2):
      outputs.update({o.request_id: o for o in engine.step() if o.finished})
  finished = run_to_completion(engine)
  outputs.update(finished)
  assert engine.stats().num_used_pages == 0
  return {rid: (o.token_ids, [e.logprob for e in o.logprobs]) for rid, o in outputs.items()}


@pytest.mark.parametrize("num_scheduler_steps", [1, 4])
def test_prefill_first_generates_the_default_schedulers_tokens(num_scheduler_steps):
  expected = _generate(num_scheduler_steps=num_scheduler_steps)
  outputs = _generate(num_scheduler_steps=num_scheduler_steps, prefill_first=True)
  assert outputs.keys() == expected.keys() and len(outputs) == 6
  for request_id, (tokens, logprobs) in expected.items():
    assert outputs[request_id][0] == tokens, request_id
    np.testing.assert_allclose(outputs[request_id][1], logprobs, atol=1e-4)
