"""Window-aware pages in the engine, on the tiny Gemma 3 checkpoint (tests/models/hf_checkpoints.py:
one global and two sliding layers of window 5, so three KV groups of one slot) with 4-token
pages, so windows end inside pages and the sliding layers' pages are freed as a context grows.

One engine serves every test: a pool too small for two of these requests at once (and for one
without window freeing), chunked prefill, async scheduling, decode bursts of 4, prefix caching,
every program compiled at warmup. Tokens and their top-5 logprobs are compared with
transformers' greedy decoding: this model puts nearly all its mass on one token, so a page
released one step early changes the alternatives' logprobs, not the tokens. Top-N logprobs run
single steps; a decode burst's pages are checked by a later request that hits them in the
prefix cache. Each test also checks that nothing compiled after warmup.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from jaxserve.api.outputs import RequestOutput
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.bench.bench_offline import pool_capacity
from jaxserve.messages.scheduled_batch import ScheduledBatch
from tests.integration.engine_helpers import hf_greedy, run_to_completion, small_engine
from tests.models.hf_checkpoints import GEMMA3_WINDOW, TOKENIZER_VOCAB_SIZE, load_hf_model

PAGE, NUM_PAGES, CHUNK = 4, 31, 16  # 30 usable pages
NUM_SLIDING_GROUPS = 2
# a sliding group holds at most the pages of a chunk and of the window before it
SLIDING_BOUND = math.ceil((GEMMA3_WINDOW - 1 + CHUNK) / PAGE) + 1


@pytest.fixture(scope="module")
def gemma3(hf_checkpoint):
  checkpoint = hf_checkpoint("gemma3")
  engine = small_engine(
    str(checkpoint),
    page_size=PAGE,
    num_pages=NUM_PAGES,
    max_model_len=64,
    max_num_seqs=4,
    max_tokens_per_step=CHUNK,
    seq_buckets=(4,),
    token_buckets=(16,),
    num_scheduler_steps=4,
    warmup="full",
  )
  assert engine.scheduler.layout.num_groups == 1 + NUM_SLIDING_GROUPS
  return engine, load_hf_model(checkpoint)


def record_batches(engine) -> list[ScheduledBatch]:
  """Wraps the runner's dispatch; the returned list grows by each dispatched batch."""
  batches: list[ScheduledBatch] = []
  dispatch = engine.runner.dispatch

  def recording(inputs, batch):
    batches.append(batch)
    return dispatch(inputs, batch)

  engine.runner.dispatch = recording
  return batches


def check_tables(batches: list[ScheduledBatch]) -> None:
  """Every sequence's global table covers its context; each sliding table holds at most the
  window bound, and somewhere pages were freed (null entries below a window)."""
  freed = False
  for batch in batches:
    for seq in batch.seqs:
      end = seq.start_position + (batch.num_steps if batch.num_steps > 1 else seq.num_tokens)
      assert len(seq.page_ids) >= math.ceil(min(end, 63) / PAGE) and 0 not in seq.page_ids
      for table in seq.window_page_ids:
        assert sum(p != 0 for p in table) <= SLIDING_BOUND
        freed |= 0 in table
  assert freed


def prompts(seed: int, *lengths: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [rng.integers(4, TOKENIZER_VOCAB_SIZE, n).tolist() for n in lengths]


def greedy(max_tokens: int, top: int = 5) -> SamplingParams:
  """Greedy decoding with the sampled token's logprob and the top-`top` (0: none, bursts run)."""
  return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=top)


@torch.no_grad()
def check_against_transformers(hf_model, prompt: list[int], output: RequestOutput) -> None:
  """output's tokens are transformers' greedy ones, with their logprobs and top alternatives
  (full forward passes over the whole context, no cache)."""
  ids = list(prompt)
  for step, (token_id, logprob) in enumerate(zip(output.token_ids, output.logprobs, strict=True)):
    want = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, -1].double(), -1)
    assert token_id == int(want.argmax()), f"token {step}"
    got = [(token_id, logprob.logprob), *logprob.top]
    top_ids = [i for i, _ in logprob.top]
    assert top_ids == want.topk(len(top_ids)).indices.tolist(), f"token {step}"
    np.testing.assert_allclose(
      [lp for _, lp in got], [float(want[i]) for i, _ in got], atol=1e-3, err_msg=f"token {step}"
    )
    ids.append(token_id)


def first_seq(batches: list[ScheduledBatch], request_id: str):
  return next(
    b.seqs[b.request_ids.index(request_id)] for b in batches if request_id in b.request_ids
  )


def test_a_prefix_hit_across_freed_pages_gives_transformers_tokens(gemma3):
  """`a` decodes in bursts; `b` continues a's prompt and first 8 tokens: it hits 11 pages, the
  last 2 written by a's bursts, and only the window's pages of the sliding groups."""
  engine, hf_model = gemma3
  compiled = engine.ledger.num_compilations
  batches = record_batches(engine)
  prompt, extra = prompts(1, 36, 3)
  engine.add_request(prompt, greedy(12, top=0), request_id="a")
  first = run_to_completion(engine)["a"]
  assert max(b.num_steps for b in batches) == 4
  continued = prompt + list(first.token_ids[:8]) + extra  # 47 tokens
  engine.add_request(continued, greedy(8), request_id="b")
  second = run_to_completion(engine)["b"]
  assert list(first.token_ids) == hf_greedy(hf_model, prompt, 12)
  check_against_transformers(hf_model, continued, second)
  hit = first_seq(batches, "b")
  # 11 full pages hit (44 tokens); the first query at 44 sees back to 40: page 10 on
  assert hit.start_position == 44 > GEMMA3_WINDOW
  assert all(table[:10] == (0,) * 10 and 0 not in table[10:] for table in hit.window_page_ids)
  check_tables(batches)
  assert engine.ledger.num_compilations == compiled


def test_a_preemption_across_freed_pages_gives_transformers_tokens(gemma3):
  engine, hf_model = gemma3
  compiled = engine.ledger.num_compilations
  batches = record_batches(engine)
  preempted = engine.scheduler.num_preemptions_total
  requests = prompts(2, 40, 38, 41)
  # without window freeing one request (56 tokens: 14 pages per group) would not fit the pool
  assert 3 * math.ceil(56 / PAGE) > NUM_PAGES - 1
  for i, prompt in enumerate(requests):
    engine.add_request(prompt, greedy(16), request_id=f"p{i}")
  finished = run_to_completion(engine)
  assert engine.scheduler.num_preemptions_total > preempted
  for i, prompt in enumerate(requests):
    check_against_transformers(hf_model, prompt, finished[f"p{i}"])
  check_tables(batches)
  assert engine.stats().num_used_pages == 0
  assert engine.ledger.num_compilations == compiled


def test_a_mixed_workload_compiles_nothing_after_warmup(gemma3):
  engine, _ = gemma3
  compiled = engine.ledger.num_compilations
  rng = np.random.default_rng(3)
  stem = prompts(3, 24)[0]
  for i in range(16):
    prompt = stem[: int(rng.integers(0, 24))] + prompts(10 + i, int(rng.integers(1, 20)))[0]
    params = SamplingParams(
      temperature=float(rng.choice([0.0, 0.8])),
      max_tokens=int(rng.integers(1, 64 - len(prompt))),
      ignore_eos=True,
      seed=i,
    )
    engine.add_request(prompt, params)
    if rng.random() < 0.5:
      engine.step()
  run_to_completion(engine)
  assert engine.stats().num_used_pages == 0
  assert engine.ledger.num_compilations == compiled


def test_bench_offline_counts_the_pools_tokens_with_and_without_window_freeing(gemma3):
  engine, _ = gemma3
  # 30 usable pages of 4 tokens over 3 groups: 40 tokens of context when every group keeps every
  # page. A 40-token sequence holds 10 global pages and, per sliding group (window 5),
  # ceil(4 / 4) + 1 = 2: 14 pages, so the pool holds 30 * 40 // 14 = 85 tokens of such sequences.
  assert pool_capacity(engine, 40) == {
    "kv_pool_pages": 30,
    "kv_pool_groups": 3,
    "kv_pool_tokens": 40,
    "kv_pool_tokens_windowed": 85,
  }
