"""After warmup, a randomized workload never makes XLA compile, whatever it asks for."""

from __future__ import annotations

import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from tests.integration.engine_helpers import run_to_completion, small_engine


def _random_params(rng: np.random.Generator) -> SamplingParams:
  kind = rng.integers(0, 7)
  max_tokens = int(rng.integers(1, 20))
  if kind == 0:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)
  if kind == 1:
    return SamplingParams(
      temperature=0.9,
      top_p=0.8,
      top_k=20,
      min_p=0.05,
      max_tokens=max_tokens,
      seed=int(rng.integers(0, 1000)),
    )
  if kind == 2:
    return SamplingParams(
      temperature=0.7,
      repetition_penalty=1.3,
      presence_penalty=0.5,
      frequency_penalty=0.3,
      max_tokens=max_tokens,
    )
  if kind == 3:
    return SamplingParams(temperature=0.0, logprobs=5, prompt_logprobs=3, max_tokens=max_tokens)
  if kind == 4:
    return SamplingParams(
      temperature=1.0, min_tokens=min(4, max_tokens), stop=("e", "ab"), max_tokens=max_tokens
    )
  if kind == 5:
    return SamplingParams(
      temperature=0.0, ignore_eos=True, stop_token_ids=(10, 32), max_tokens=max_tokens
    )
  bias = {int(t): float(rng.uniform(-100, 100)) for t in rng.integers(0, 256, rng.integers(1, 300))}
  return SamplingParams(
    temperature=float(rng.choice([0.0, 0.8])), logit_bias=bias, max_tokens=max_tokens
  )


def test_randomized_workload_of_200_requests_compiles_nothing_after_warmup():
  # two rungs of each bucket ladder: a step between rungs of either kind is what could compile
  engine = small_engine(
    num_pages=96, max_model_len=256, seq_buckets=(2, 8), token_buckets=(16, 64), warmup="full"
  )
  compiled_at_warmup = engine.ledger.num_compilations
  assert compiled_at_warmup > 0, "the ledger must see the warmup compilations"
  rng = np.random.default_rng(42)
  pending = [
    (rng.integers(1, 256, size=int(rng.integers(1, 150))).tolist(), _random_params(rng))
    for _ in range(200)
  ]
  finished = 0
  while pending or engine.has_unfinished_requests():
    for _ in range(int(rng.poisson(1.5))):  # random arrivals between steps
      if pending:
        prompt, params = pending.pop()
        engine.add_request(prompt, params)
    finished += sum(o.finished for o in engine.step())
  assert finished == 200
  assert engine.ledger.num_compilations == compiled_at_warmup
  assert engine.stats().num_used_pages == 0


def test_a_step_budget_that_follows_the_load_compiles_nothing_after_warmup():
  """Latency budget 16 of 64 tokens: the 64 rung pairs with 8 sequences only (buckets 2 x 16,
  8 x 16, 8 x 64). Long prompts arrive beside decoding requests; the wide rung runs, every step
  in a warmed bucket."""
  engine = small_engine(
    num_pages=96,
    max_model_len=256,
    seq_buckets=(2, 8),
    token_buckets=(16, 64),
    latency_batched_tokens=16,
    warmup="full",
  )
  compiled_at_warmup = engine.ledger.num_compilations
  rng = np.random.default_rng(7)
  params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)
  for i in range(24):
    engine.add_request(rng.integers(1, 256, size=int(rng.integers(1, 120))).tolist(), params)
    if i % 3 == 0:
      engine.step()
  run_to_completion(engine)
  assert engine.ledger.num_compilations == compiled_at_warmup
  wide = {b for b in engine.timings.per_bucket if b[1] > 16}
  assert wide and all(seqs == 8 for seqs, _ in wide)


def test_mixture_of_experts_compiles_nothing_after_warmup(hf_checkpoint):
  """Routing changes every step (which experts, how many tokens each, experts left empty), yet
  the grouped matmuls' shapes depend on the token bucket alone (models/grouped_matmul.py)."""
  engine = small_engine(
    str(hf_checkpoint("qwen3_moe")),
    max_model_len=128,
    max_tokens_per_step=32,
    seq_buckets=(8,),
    token_buckets=(8, 32),
    warmup="full",
  )
  compiled_at_warmup = engine.ledger.num_compilations
  assert compiled_at_warmup > 0
  rng = np.random.default_rng(7)
  for i in range(24):
    prompt = rng.integers(4, 400, size=int(rng.integers(1, 60))).tolist()
    params = SamplingParams(
      temperature=float(rng.choice([0.0, 0.8])), max_tokens=int(rng.integers(1, 16)), seed=i
    )
    engine.add_request(prompt, params)
    if rng.random() < 0.5:
      engine.step()
  while engine.has_unfinished_requests():
    engine.step()
  assert engine.ledger.num_compilations == compiled_at_warmup
