"""Tensor parallelism changes where the math runs, not its result: greedy tokens at tp = 2, 4, 8
equal the unsharded engine's (and transformers'), prompt logprobs agree closely."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.composition.assembly import build_engine
from tests.integration.engine_helpers import (
  generate_and_score,
  hf_greedy,
  record_steps_per_dispatch,
  small_config,
)
from tests.models.hf_checkpoints import TOKENIZER_VOCAB_SIZE, TP_FAMILIES, load_hf_model
from tests.parallel.mesh.conftest import tp_engine

NUM_NEW_TOKENS = 12
PROMPT_LENGTHS = (3, 17, 41)
TP_SIZES = (1, 2, 4, 8)


def _prompts(seed: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [rng.integers(4, TOKENIZER_VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]


@pytest.mark.parametrize("family", TP_FAMILIES)
def test_greedy_tokens_identical_for_every_tensor_parallel_size(family, hf_checkpoint, engine_for):
  checkpoint = hf_checkpoint(family)
  prompts = _prompts(seed=TP_FAMILIES.index(family))
  results = {
    tp: generate_and_score(engine_for(checkpoint, tp), prompts, NUM_NEW_TOKENS) for tp in TP_SIZES
  }
  unsharded_tokens, unsharded_logprobs = results[1]
  hf_model = load_hf_model(checkpoint)
  assert unsharded_tokens == [hf_greedy(hf_model, p, NUM_NEW_TOKENS) for p in prompts]
  for tp in TP_SIZES[1:]:
    tokens, logprobs = results[tp]
    assert tokens == unsharded_tokens, f"tensor_parallel_size={tp}"
    for ours, reference in zip(logprobs, unsharded_logprobs, strict=True):
      np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=0, err_msg=f"tp={tp}")


def test_tensor_parallel_size_must_divide_kv_heads_or_be_a_multiple(hf_checkpoint):
  checkpoint = hf_checkpoint("llama")  # 2 kv heads (4 devices: each on two, test_expert_parallel)
  with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide the model's 2 kv"):
    build_engine(small_config(str(checkpoint), tensor_parallel_size=3), show_progress=False)


def test_decode_bursts_at_tp2_match_single_steps(hf_checkpoint, engine_for):
  """The sharded runner's burst program (scheduler.num_scheduler_steps) gives the greedy tokens
  of single steps at tp = 2."""
  checkpoint = hf_checkpoint("llama_kv8")
  prompts = _prompts(seed=11)
  tokens, _ = generate_and_score(engine_for(checkpoint, 2), prompts, NUM_NEW_TOKENS)
  bursting = tp_engine(checkpoint, 2, num_scheduler_steps=4)
  dispatched = record_steps_per_dispatch(bursting)
  burst_tokens, _ = generate_and_score(bursting, prompts, NUM_NEW_TOKENS)
  assert 4 in dispatched
  assert burst_tokens == tokens
