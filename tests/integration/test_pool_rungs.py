"""scheduler.pool_seq_rungs on a real engine: a pool of 24 pages of 16 tokens holds 3 sequences of
max_model_len 128, so a ladder of [8, 64] gets rungs 16 and 32 (3 rounded up to 8 is a rung
already; 16 and 32 are more than 1.25x below 64). 20 requests of 16 + 8 tokens (2 pages each at
the end) run at most 20 at once, so every step runs in a 8-, 16- or 32-sequence bucket, where
the ladder without the rungs pads every batch of more than 8 to 64."""

from __future__ import annotations

from jaxserve.api.sampling_params import SamplingParams
from tests.integration.engine_helpers import run_to_completion, small_engine


def test_a_kv_bound_batch_runs_in_a_pool_rung():
  engine = small_engine(
    max_num_seqs=64,
    seq_buckets=(8, 64),
    token_buckets=(64,),
    max_tokens_per_step=64,
    num_pages=25,  # page 0 is the null page: 24 x 16 = 384 tokens
    max_model_len=128,
    pool_seq_rungs=True,
  )
  assert engine.runner.buckets.seq_buckets == (8, 16, 32, 64)
  params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
  for i in range(20):
    engine.add_request(list(range(1 + i, 17 + i)), params, request_id=f"r{i}")
  finished = run_to_completion(engine)
  assert sorted(len(o.token_ids) for o in finished.values()) == [8] * 20
  used = set(engine.timings.per_bucket)
  assert used & {(16, 64), (32, 64)} and (64, 64) not in used, used
  assert engine.stats().num_used_pages == 0
