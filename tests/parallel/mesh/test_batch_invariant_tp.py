"""batch_invariant composes with tp_invariant_reductions: in float32 (where every rounding shows in
the logprobs) a greedy probe gives bitwise the same tokens and sampled-token logprobs alone at tp =
1 (one prefill chunk, small buckets) and at tp = 2 inside a crowd with 8-token prefill chunks and
other buckets."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from tests.integration.engine_helpers import run_to_completion, small_engine
from tests.models.hf_checkpoints import TOKENIZER_VOCAB_SIZE, build_hf_checkpoint

PROBE = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return build_hf_checkpoint("llama_kv8", tmp_path_factory.mktemp("llama_kv8"))


def _probe(engine, prompt, crowd: int) -> tuple[tuple[int, ...], np.ndarray]:
  rng = np.random.default_rng(3)
  for i in range(crowd):
    engine.add_request(
      rng.integers(4, TOKENIZER_VOCAB_SIZE, int(rng.integers(1, 30))).tolist(),
      SamplingParams(temperature=0.0, max_tokens=int(rng.integers(1, 16)), ignore_eos=True),
      request_id=f"other-{i}",
    )
    if i == crowd // 2:
      engine.add_request(prompt, PROBE, request_id="probe")
  if crowd == 0:
    engine.add_request(prompt, PROBE, request_id="probe")
  out = run_to_completion(engine)["probe"]
  return out.token_ids, np.array([e.logprob for e in out.logprobs], np.float32)


def test_tp1_alone_is_bitwise_tp2_in_a_crowd(checkpoint):
  prompt = np.random.default_rng(0).integers(4, TOKENIZER_VOCAB_SIZE, 27).tolist()
  common = dict(
    dtype="float32",
    attention_backend="xla",
    batch_invariant=True,
    tp_invariant_reductions=True,
    max_model_len=128,
    num_pages=64,
  )
  alone = small_engine(
    str(checkpoint),
    tensor_parallel_size=1,
    max_num_seqs=2,
    seq_buckets=(2,),
    token_buckets=(32,),
    max_tokens_per_step=32,
    **common,
  )
  crowd = small_engine(
    str(checkpoint),
    tensor_parallel_size=2,
    max_num_seqs=8,
    seq_buckets=(4, 8),
    token_buckets=(8,),
    max_tokens_per_step=8,
    **common,
  )
  tokens_1, logprobs_1 = _probe(alone, prompt, 0)
  tokens_2, logprobs_2 = _probe(crowd, prompt, 6)
  assert tokens_2 == tokens_1
  np.testing.assert_array_equal(logprobs_2.view(np.int32), logprobs_1.view(np.int32))


def test_tp2_alone_is_bitwise_tp2_in_a_crowd_without_tp_invariant_reductions(checkpoint):
  """batch_invariant alone at tp = 2 (XLA partitions the fixed-tile GEMMs)."""
  prompt = np.random.default_rng(1).integers(4, TOKENIZER_VOCAB_SIZE, 27).tolist()
  common = dict(
    dtype="float32",
    attention_backend="xla",
    batch_invariant=True,
    tensor_parallel_size=2,
    max_model_len=128,
    num_pages=64,
  )
  alone = small_engine(
    str(checkpoint),
    max_num_seqs=2,
    seq_buckets=(2,),
    token_buckets=(32,),
    max_tokens_per_step=32,
    **common,
  )
  crowd = small_engine(
    str(checkpoint),
    max_num_seqs=8,
    seq_buckets=(4, 8),
    token_buckets=(8,),
    max_tokens_per_step=8,
    **common,
  )
  tokens_1, logprobs_1 = _probe(alone, prompt, 0)
  tokens_2, logprobs_2 = _probe(crowd, prompt, 6)
  assert tokens_2 == tokens_1
  np.testing.assert_array_equal(logprobs_2.view(np.int32), logprobs_1.view(np.int32))
