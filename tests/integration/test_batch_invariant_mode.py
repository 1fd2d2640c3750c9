"""batch_invariant on CPU: a greedy probe's tokens and sampled-token logprobs are bitwise those
it gets alone, whatever its batch mates, the prefill chunk size, decode bursts, a tight KV pool
(preemption) and prefix-cache hits (a mate holding the probe's first page), with the XLA
attention path, the GPU kernel (Pallas interpret mode) and the TPU kernel (TPU interpret mode).
Hypothesis draws the compositions (a few examples each: the interpreted kernels are slow).

Float32 tiny-random, where every rounding shows in the logprobs: without the mode the same
draws differ (test_the_property_fails_without_the_mode)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.attention import backends
from tests.integration.engine_helpers import interpreted_backend, run_to_completion, small_engine
from tests.models.hf_checkpoints import build_hf_checkpoint

PROBE = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=0)
VOCAB = 500


def compositions(max_mates: int, max_new: int, chunks: tuple[int, ...]):
  """Even the simplest draw (hypothesis tries it first) chunks the probe among two mates."""
  mates = st.lists(
    st.tuples(st.integers(5, 40), st.integers(2, max_new), st.sampled_from([0.0, 0.9])),
    min_size=2,
    max_size=max_mates,
  )
  return st.fixed_dictionaries(
    {
      "probe_len": st.integers(20, 50),
      "mates": mates,
      "chunk": st.sampled_from(chunks),
      "share_prefix": st.booleans(),
      "seed": st.integers(0, 99),
    }
  )


@functools.cache
def _engine(backend: str, invariant: bool, chunk: int, model: str = "tiny-random"):
  """chunk 64: the reference engine (a probe's prompt in one chunk, one sequence bucket, single
  steps); otherwise a crowd engine with `chunk`-token steps, a 12-page pool (preemption) and,
  on the XLA path, decode bursts of 4 (the interpreted kernels compile no bursts: slow)."""
  if chunk == 64:
    return small_engine(
      model,
      attention_backend=backend,
      batch_invariant=invariant,
      max_num_seqs=8,
      seq_buckets=(8,),
      token_buckets=(64,),
      max_tokens_per_step=64,
      num_pages=64,
      max_model_len=128,
    )
  return small_engine(
    model,
    attention_backend=backend,
    batch_invariant=invariant,
    max_num_seqs=8,
    seq_buckets=(2, 8),
    token_buckets=(chunk,),
    max_tokens_per_step=chunk,
    num_pages=8,
    max_model_len=128,
    num_scheduler_steps=4 if backend == "xla" else 1,
  )


def _run(engine, requests) -> tuple[tuple[int, ...], bytes]:
  for rid, prompt, params in requests:
    engine.add_request(prompt, params, request_id=rid)
  out = run_to_completion(engine)["probe"]
  assert engine.stats().num_used_pages == 0
  return out.token_ids, np.array([e.logprob for e in out.logprobs], np.float32).tobytes()


def _check(backend: str, draw: dict, invariant: bool = True, model: str = "tiny-random") -> bool:
  rng = np.random.default_rng(draw["seed"])
  probe = rng.integers(1, VOCAB, draw["probe_len"]).tolist()
  alone = _run(_engine(backend, invariant, 64, model), [("probe", probe, PROBE)])
  requests = [
    (
      f"mate-{i}",
      rng.integers(1, VOCAB, n).tolist(),
      SamplingParams(temperature=t, max_tokens=m, seed=i, ignore_eos=True),
    )
    for i, (n, m, t) in enumerate(draw["mates"])
  ]
  if draw["share_prefix"] and draw["probe_len"] > 16:  # its first page from the prefix cache
    requests.insert(0, ("prefix", probe[:16], SamplingParams(temperature=0.0, max_tokens=2)))
  requests.insert(len(requests) // 2, ("probe", probe, PROBE))
  crowd = _run(_engine(backend, invariant, draw["chunk"], model), requests)
  return crowd == alone


@settings(
  max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(draw=compositions(5, 12, (8, 16)))
def test_xla_path_is_batch_invariant(draw):
  assert _check("xla", draw)


@settings(
  max_examples=2, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(draw=compositions(3, 6, (8,)))
def test_gpu_kernel_is_batch_invariant(draw, monkeypatch_factories):
  assert _check("pallas_gpu", draw)


@settings(
  max_examples=1, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(draw=compositions(3, 6, (16,)))
def test_tpu_kernel_is_batch_invariant(draw, monkeypatch_factories):
  assert _check("pallas_tpu", draw)


def test_the_property_fails_without_the_mode():
  draw = {
    "probe_len": 45,
    "mates": [(40, 12, 0.0), (35, 12, 0.9), (30, 12, 0.0), (25, 12, 0.0), (20, 12, 0.0)],
    "chunk": 8,
    "share_prefix": False,
    "seed": 0,
  }
  crowd_engine = _engine("xla", True, 8, "tiny-random")
  preemptions = crowd_engine.stats().num_preemptions
  assert _check("xla", draw)
  assert crowd_engine.stats().num_preemptions > preemptions  # the pool is tight
  assert not _check("xla", draw, invariant=False)


def test_tied_embeddings(tmp_path):
  """The logits of a tied-embedding model come from the [V, H] embedding itself."""
  model = str(build_hf_checkpoint("llama_tied", tmp_path / "tied"))
  draw = {
    "probe_len": 33,
    "mates": [(30, 12, 0.0), (7, 12, 0.9), (20, 5, 0.0)],
    "chunk": 8,
    "share_prefix": True,
    "seed": 1,
  }
  assert _check("xla", draw, model=model)


@pytest.fixture(scope="module")
def monkeypatch_factories():
  """The kernels' backends run interpreted on the CPU for this module."""
  with pytest.MonkeyPatch.context() as patch:
    for kernel in ("gpu", "tpu"):
      patch.setitem(
        backends._FACTORIES, f"pallas_{kernel}", lambda kernel=kernel: interpreted_backend(kernel)
      )
    yield
