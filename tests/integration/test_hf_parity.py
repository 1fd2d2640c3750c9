"""jaxserve against Hugging Face transformers on tiny random checkpoints of every supported family:
greedy tokens over a batch of mixed-length prompts, and prompt logprobs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from jaxserve.sampling_params import SamplingParams
from tests.integration.engine_helpers import run_to_completion, small_engine
from tests.models.hf_checkpoints import FAMILIES, TOKENIZER_VOCAB_SIZE, load_hf_model

NUM_NEW_TOKENS = 32
PROMPT_LENGTHS = (3, 16, 17, 41, 64)


def _prompts(seed: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [rng.integers(4, TOKENIZER_VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]


@torch.no_grad()
def _hf_greedy(model, prompt: list[int], num_new: int) -> list[int]:
  """Greedy decoding by full forward passes (no cache API, so no version-specific arguments)."""
  ids = list(prompt)
  for _ in range(num_new):
    ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
  return ids[len(prompt):]


@torch.no_grad()
def _hf_prompt_logprobs(model, prompt: list[int]) -> np.ndarray:
  logprobs = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), dim=-1)
  return np.array([float(logprobs[t, prompt[t + 1]]) for t in range(len(prompt) - 1)])


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_and_prompt_logprobs_match_transformers(family, hf_checkpoint):
  checkpoint = hf_checkpoint(family)
  hf_model = load_hf_model(checkpoint)
  prompts = _prompts(seed=FAMILIES.index(family))
  # 16-token chunks split the longer prompts across steps; all prompts share the batch.
  engine = small_engine(str(checkpoint), max_model_len=128, max_tokens_per_step=32,
                        token_buckets=(8, 16, 32), prefix_caching=False)
  greedy = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
  scoring = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
  for i, prompt in enumerate(prompts):
    engine.add_request(prompt, greedy, request_id=f"gen-{i}")
    engine.add_request(prompt, scoring, request_id=f"score-{i}")
  finished = run_to_completion(engine)

  for i, prompt in enumerate(prompts):
    expected = _hf_greedy(hf_model, prompt, NUM_NEW_TOKENS)
    assert list(finished[f"gen-{i}"].token_ids) == expected, f"prompt {i} (len {len(prompt)})"
    ours = finished[f"score-{i}"].prompt_logprobs
    assert ours[0] is None and len(ours) == len(prompt)
    assert [e.token_id for e in ours[1:]] == prompt[1:]
    np.testing.assert_allclose([e.logprob for e in ours[1:]], _hf_prompt_logprobs(hf_model, prompt),
                               atol=1e-3, rtol=0)
