"""The engine with each Pallas kernel, run on the CPU in its interpreter (the GPU kernel in
Pallas interpret mode, the TPU kernel in TPU interpret mode), generates exactly the greedy
tokens of the XLA attention path, with logprobs within float32 noise. The workload has what the
engine hands a kernel in serving: ragged prefill chunks next to decodes, padding tokens and
sequence slots, prefix-cache hits, a prompt longer than a step (chunked), and decode bursts that
run to max_model_len, the block table's last position. The same holds for the GPU greedy
sampling kernel in place of XLA's argmax and logsumexp."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.attention import backends
from tests.integration.engine_helpers import interpreted_backend, run_to_completion, small_engine

MAX_MODEL_LEN = 80  # 5 pages of 16


def _generate(backend_name: str, sampler_backend: str = "xla") -> dict:
  engine = small_engine(
    attention_backend=backend_name,
    seq_buckets=(8,),
    token_buckets=(8, 64),
    num_scheduler_steps=4,
    max_model_len=MAX_MODEL_LEN,
    num_pages=64,
    sampler_backend=sampler_backend,
  )
  rng = np.random.default_rng(0)
  shared = rng.integers(0, engine.vocab_size, 32).tolist()  # two full pages to share
  prompts = [
    rng.integers(0, engine.vocab_size, 51).tolist(),  # ends at max_model_len
    shared + rng.integers(0, engine.vocab_size, 5).tolist(),
    shared + rng.integers(0, engine.vocab_size, 9).tolist(),  # a prefix-cache hit
    rng.integers(0, engine.vocab_size, 70).tolist(),  # chunked: > 64 per step
    rng.integers(0, engine.vocab_size, 3).tolist(),
  ]
  for i, prompt in enumerate(prompts):
    params = SamplingParams(
      temperature=0.0,
      max_tokens=MAX_MODEL_LEN - len(prompt) if i == 0 else 9,
      ignore_eos=True,
      logprobs=0,
    )
    engine.add_request(prompt, params, request_id=f"r{i}")
  finished = run_to_completion(engine)
  assert engine.stats().num_used_pages == 0
  return {rid: (out.token_ids, [e.logprob for e in out.logprobs]) for rid, out in finished.items()}


@pytest.fixture(scope="module")
def xla_outputs():
  return _generate("xla")


@pytest.mark.parametrize("kernel", ["gpu", "tpu"])
def test_kernel_engine_matches_the_xla_path(kernel, xla_outputs, monkeypatch):
  monkeypatch.setitem(backends._FACTORIES, f"pallas_{kernel}", lambda: interpreted_backend(kernel))
  outputs = _generate(f"pallas_{kernel}")
  assert outputs.keys() == xla_outputs.keys()
  for request_id, (tokens, logprobs) in xla_outputs.items():
    assert outputs[request_id][0] == tokens, request_id
    np.testing.assert_allclose(outputs[request_id][1], logprobs, atol=1e-4)


def test_greedy_sample_kernel_engine_matches_the_xla_sampler(xla_outputs):
  """The sampler's greedy pick and logprobs from the GPU kernel (Pallas interpret mode), in
  single steps and in decode bursts."""
  outputs = _generate("xla", sampler_backend="pallas_gpu")
  assert outputs.keys() == xla_outputs.keys()
  for request_id, (tokens, logprobs) in xla_outputs.items():
    assert outputs[request_id][0] == tokens, request_id
    np.testing.assert_allclose(outputs[request_id][1], logprobs, atol=1e-5)
