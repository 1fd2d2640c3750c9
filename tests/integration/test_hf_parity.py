"""jaxserve against Hugging Face transformers on tiny random checkpoints of every supported family:
greedy tokens over a batch of mixed-length prompts, and prompt logprobs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.integration.engine_helpers import generate_and_score, hf_greedy, small_engine
from tests.models.hf_checkpoints import FAMILIES, TOKENIZER_VOCAB_SIZE, load_hf_model

NUM_NEW_TOKENS = 32
PROMPT_LENGTHS = (3, 16, 17, 41, 64)


def _prompts(seed: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [rng.integers(4, TOKENIZER_VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]


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
  engine = small_engine(
    str(checkpoint),
    max_model_len=128,
    max_tokens_per_step=32,
    token_buckets=(8, 16, 32),
    prefix_caching=False,
  )
  tokens, logprobs = generate_and_score(engine, prompts, NUM_NEW_TOKENS)
  for i, prompt in enumerate(prompts):
    assert tokens[i] == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS), f"prompt {i} ({len(prompt)})"
    assert len(logprobs[i]) == len(prompt) - 1
    np.testing.assert_allclose(
      logprobs[i], _hf_prompt_logprobs(hf_model, prompt), atol=1e-3, rtol=0
    )
