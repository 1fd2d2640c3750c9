"""Bad input raises ValueError naming the field, and the engine keeps serving everyone else."""

from __future__ import annotations

import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.composition.assembly import build_engine
from jaxserve.config import EngineConfig
from tests.integration.engine_helpers import run_to_completion, small_engine


@pytest.fixture(scope="module")
def engine():
  return small_engine(max_model_len=128)


GOOD = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize(
  "field, make",
  [
    ("max_tokens", lambda: SamplingParams(max_tokens=0)),
    ("temperature", lambda: SamplingParams(temperature=-1.0)),
    ("top_p", lambda: SamplingParams(top_p=0.0)),
    ("top_p", lambda: SamplingParams(top_p=1.5)),
    ("top_k", lambda: SamplingParams(top_k=-5)),
    ("min_p", lambda: SamplingParams(min_p=2.0)),
    ("presence_penalty", lambda: SamplingParams(presence_penalty=3.0)),
    ("frequency_penalty", lambda: SamplingParams(frequency_penalty=-2.5)),
    ("repetition_penalty", lambda: SamplingParams(repetition_penalty=0.0)),
    ("logprobs", lambda: SamplingParams(logprobs=21)),
    ("min_tokens", lambda: SamplingParams(min_tokens=20, max_tokens=10)),
    ("seed", lambda: SamplingParams(seed=-1)),
    ("n", lambda: SamplingParams(n=0)),
  ],
)
def test_out_of_range_sampling_values_name_the_field(field, make):
  with pytest.raises(ValueError, match=rf"^{field}:"):
    make()


def test_bad_requests_are_refused_while_others_keep_running(engine):
  reference = small_engine(max_model_len=128)
  reference.add_request([5, 6, 7, 8], GOOD, request_id="alone")
  expected = run_to_completion(reference)["alone"].token_ids

  engine.add_request([5, 6, 7, 8], GOOD, request_id="good-1")
  engine.step()  # good-1 is now running
  with pytest.raises(ValueError, match=r"^prompt:.*exceeds max_model_len 128"):
    engine.add_request(list(range(1, 121)), SamplingParams(max_tokens=16))
  with pytest.raises(ValueError, match=r"^prompt:.*exceeds max_model_len"):
    engine.add_request("x" * 500, SamplingParams(max_tokens=1))
  with pytest.raises(ValueError, match=r"^prompt: must not be empty"):
    engine.add_request("", GOOD)
  with pytest.raises(ValueError, match=r"^prompt: token id 100000 is out of range"):
    engine.add_request([1, 100000], GOOD)
  with pytest.raises(ValueError, match=r"^prompt: token id -1"):
    engine.add_request([-1], GOOD)
  with pytest.raises(ValueError, match=r"^request_id:"):
    engine.add_request([1, 2], GOOD, request_id="good-1")
  engine.add_request([5, 6, 7, 8], GOOD, request_id="good-2")
  finished = run_to_completion(engine)
  assert set(finished) == {"good-1", "good-2"}
  assert finished["good-1"].token_ids == expected
  assert finished["good-2"].token_ids == expected
  assert engine.stats().num_used_pages == 0 and engine.stats().num_waiting == 0


@pytest.mark.parametrize("model", ["no-such-model", "/nonexistent/checkpoint/dir"])
def test_unknown_model_name_or_path_names_the_field(model):
  with pytest.raises(ValueError, match=r"^model:"):
    build_engine(EngineConfig(model=model), show_progress=False)


@pytest.mark.parametrize(
  "overrides, field",
  [
    (dict(dtype="float64"), "dtype"),
    (dict(attention_backend="cuda-magic"), "attention_backend"),
    (dict(max_model_len=0), "max_model_len"),
    (dict(gpu_gemm="triton"), "gpu_gemm"),
  ],
)
def test_bad_engine_config_names_the_field(overrides, field):
  with pytest.raises(ValueError, match=rf"^{field}:"):
    EngineConfig(**overrides)


def test_max_model_len_beyond_the_model_is_refused():
  with pytest.raises(ValueError, match=r"^max_model_len:"):
    build_engine(EngineConfig(max_model_len=10**6), show_progress=False)


def test_a_prompt_is_checked_once_into_one_tuple_that_every_layer_shares(engine):
  """One record per choice (engine/core_io.new_core_requests): the prompt's ids become one tuple,
  which the core's requests and every output share (no layer copies it), and a bad id refuses
  the prompt's choices all or none."""
  prompt = [5, 6, 7, 8]
  ids = engine.add_requests(prompt, [GOOD, GOOD], ["shared-0", "shared-1"])
  assert ids == tuple(prompt)
  assert all(engine.core.requests[r].prompt_token_ids is ids for r in ("shared-0", "shared-1"))
  with pytest.raises(ValueError, match=r"^prompt: token id 100000"):
    engine.add_requests([1, 100000], [GOOD, GOOD], ["bad-0", "bad-1"])
  with pytest.raises(ValueError, match=r"^request_id:"):  # the second is refused by the core
    engine.add_requests(prompt, [GOOD, GOOD], ["fresh-0", "shared-0"])
  finished = run_to_completion(engine)
  assert set(finished) == {"shared-0", "shared-1"}  # fresh-0 was taken back with its sibling
  assert all(finished[r].prompt_token_ids is ids for r in finished)
  assert finished["shared-0"].token_ids == finished["shared-1"].token_ids  # greedy, same prompt
  assert engine.stats().num_used_pages == 0 and engine.stats().num_waiting == 0
