"""The engine over an 8-bit KV cache (cache.kv_cache_dtype fp8 / int8) on tiny-random, against the
same engine over float32 pages, and the refusal of a backend that cannot read the pages.

tiny-random's logits are nearly flat (random weights), so free-running greedy decoding diverges
for good at the first near-tie that rounding flips. The comparison is teacher-forced instead: the
8-bit engine scores the float engine's greedy continuation as a prompt (prompt_logprobs), and
each position's top token and the chosen token's logprob are compared with the float run's."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.attention import backends
from jaxserve.composition.assembly import build_engine
from jaxserve.config import CacheConfig, EngineConfig
from tests.integration.engine_helpers import run_to_completion, small_config

PROMPTS = [[1 + (7 * i + 3 * j) % 200 for j in range(5 + 9 * i)] for i in range(2)]
NEW_TOKENS = 24
# measured on tiny-random (48 positions): fp8 0.958, drift max 0.073; int8 0.958, max 0.045
MIN_AGREEMENT = 0.85
MAX_LOGPROB_DRIFT = 0.15


def _engine(kv_cache_dtype: str):
  config = small_config(
    attention_backend="xla", max_num_seqs=2, seq_buckets=(2,), token_buckets=(64,)
  )
  cache = dataclasses.replace(config.cache, kv_cache_dtype=kv_cache_dtype)
  return build_engine(config.replace(cache=cache), show_progress=False)


def _run(engine, prompts, params):
  for i, prompt in enumerate(prompts):
    engine.add_request(prompt, params, request_id=str(i))
  outputs = run_to_completion(engine)
  return [outputs[str(i)] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def float_run():
  params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=0, ignore_eos=True)
  return _run(_engine("auto"), PROMPTS, params)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
def test_greedy_tokens_agree_with_float_pages(float_run, kv_cache_dtype):
  start = time.perf_counter()
  engine = _engine(kv_cache_dtype)
  assert engine.runner.kv_pages[0][0].dtype.itemsize == 1
  sequences = [list(o.prompt_token_ids) + list(o.token_ids) for o in float_run]
  params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1, ignore_eos=True)
  scored = _run(engine, sequences, params)
  agree, drift = [], []
  for expected, output in zip(float_run, scored, strict=True):
    positions = output.prompt_logprobs[len(expected.prompt_token_ids) :]
    for want, got in zip(expected.logprobs, positions, strict=True):
      top_id = max(got.top, key=lambda pair: pair[1])[0] if got.top else got.token_id
      agree.append(top_id == want.token_id)
      drift.append(abs(got.logprob - want.logprob))
  agreement, drift = float(np.mean(agree)), np.array(drift)
  print(
    f"{kv_cache_dtype} KV: teacher-forced greedy agreement {agreement:.3f} over {len(agree)} "
    f"positions, logprob drift max {drift.max():.4f} mean {drift.mean():.5f} "
    f"({time.perf_counter() - start:.1f} s)"
  )
  assert len(agree) == len(PROMPTS) * NEW_TOKENS
  assert agreement >= MIN_AGREEMENT
  assert drift.max() <= MAX_LOGPROB_DRIFT


def test_a_backend_that_cannot_read_the_pages_is_refused_before_loading(monkeypatch):
  float_only = backends.XLA.replace(
    capabilities=backends.XLA.capabilities.replace(dtypes=("float32", "bfloat16"))
  )
  monkeypatch.setitem(backends._FACTORIES, "xla", lambda: float_only)
  loaded = []
  monkeypatch.setattr(
    "jaxserve.parallel.placement.load_model", lambda *a, **k: loaded.append(a) or 1 / 0
  )
  with pytest.raises(ValueError, match="^kv_cache_dtype: the xla attention backend cannot read "):
    _engine("fp8")
  assert not loaded  # refused before the weights load
  with pytest.raises(ZeroDivisionError):  # float pages: accepted, on to the (stubbed) loader
    _engine("auto")
  assert loaded


def _tpu_config(backend: str, kv_cache_dtype: str, page_size: int) -> EngineConfig:
  cache = CacheConfig(page_size=page_size, kv_cache_dtype=kv_cache_dtype)
  return EngineConfig(attention_backend=backend, cache=cache)


def test_the_tpu_kernel_reads_8bit_pages_of_32_or_64_tokens_only():
  """The Pallas TPU kernel tiles 8-bit pages in 32 rows: any other page size is refused by the
  config, naming cache.page_size, before the kernel is ever called."""
  for kv_cache_dtype in ("fp8", "int8"):
    for page_size in (16, 128):
      with pytest.raises(ValueError, match=f"^cache.page_size: .* got {page_size}$"):
        _tpu_config("pallas_tpu", kv_cache_dtype, page_size)
    for page_size in (32, 64):
      _tpu_config("pallas_tpu", kv_cache_dtype, page_size)
  _tpu_config("pallas_tpu", "auto", 16)  # bfloat16 pages: 16 reads
  _tpu_config("xla", "int8", 16)
