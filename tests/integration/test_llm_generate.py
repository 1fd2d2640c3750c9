"""LLM.generate dispatches the first step once its prompts are queued and queues the rest while
the device runs it: the results are those of the engine run with every request queued first,
and a bad prompt found after that first step still adds nothing and leaks no page."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.entrypoints.llm import LLM
from tests.integration.engine_helpers import run_to_completion, small_config, small_engine

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)


def _prompts(vocab_size: int) -> list[list[int]]:
  rng = np.random.default_rng(4)
  return [rng.integers(0, vocab_size, n).tolist() for n in (30, 25, 40, 7, 19, 33, 12, 50)]


@pytest.fixture(scope="module")
def llm():
  config = small_config(max_tokens_per_step=64)  # the first step's budget: two prompts
  return LLM(config.model, config=config, show_progress=False)


def test_generate_matches_the_engine_with_every_request_queued_first(llm):
  prompts = _prompts(llm.engine.vocab_size)
  results = llm.generate(prompts, PARAMS, use_tqdm=False)
  engine = small_engine(max_tokens_per_step=64)
  for i, prompt in enumerate(prompts):
    engine.add_request(prompt, PARAMS, request_id=str(i))
  expected = run_to_completion(engine)
  for i, result in enumerate(results):
    completion = result.outputs[0]
    assert list(completion.token_ids) == list(expected[str(i)].token_ids), i
    np.testing.assert_allclose(
      [e.logprob for e in completion.logprobs],
      [e.logprob for e in expected[str(i)].logprobs],
      atol=1e-5,
    )
  assert llm.engine.stats().num_used_pages == 0


def test_a_bad_prompt_after_the_first_step_adds_nothing(llm):
  prompts = _prompts(llm.engine.vocab_size)
  too_long = SamplingParams(max_tokens=10_000)
  params = [PARAMS] * (len(prompts) - 1) + [too_long]  # found after the first step ran
  steps_before = llm.engine.timings.num_steps
  with pytest.raises(ValueError, match="max_tokens|max_model_len"):
    llm.generate(prompts, params, use_tqdm=False)
  assert llm.engine.timings.num_steps > steps_before  # the first step had been dispatched
  assert not llm.engine.has_unfinished_requests()
  assert llm.engine.stats().num_used_pages == 0
  assert len(llm.generate(prompts[:2], PARAMS, use_tqdm=False)) == 2
