"""Structured outputs through the engine, on a tiny random-weight Qwen2 checkpoint with a real
byte-level BPE tokenizer: every constrained output is valid (checked with jsonschema and `re`,
not with llguidance), whatever the scheduling (async or not, chunked prefill, preemption, n > 1,
decode bursts for the unconstrained), and unconstrained requests are untouched by constrained
batch mates."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.engine.request_state import RequestState
from jaxserve.structured import StructuredOutputError, StructuredOutputSpec
from tests.integration.engine_helpers import run_to_completion, small_engine
from tests.integration.structured_helpers import (
  CHOICES,
  MAX_TOKENS,
  REGEX,
  SCHEMAS,
  assert_regex,
  assert_valid_json,
)

PROMPTS = [
  "Hello, world!",
  "The quick brown fox",
  "def main():",
  "Paged attention stores keys and values in fixed-size pages.",
]  # > 8 tokens: chunked


@pytest.fixture(scope="module")
def checkpoint(hf_checkpoint):
  return str(hf_checkpoint("qwen2"))


def _constrained(i: int, temperature: float) -> tuple[SamplingParams, str]:
  """The i-th constraint of a mix (json schemas, regex, choice) and its kind."""
  kind = ("person", "points", "regex", "choice")[i % 4]
  common = dict(temperature=temperature, max_tokens=MAX_TOKENS, seed=i)
  if kind == "regex":
    return SamplingParams(structured_outputs={"regex": REGEX}, **common), kind
  if kind == "choice":
    return SamplingParams(structured_outputs={"choice": list(CHOICES)}, **common), kind
  return SamplingParams(
    structured_outputs=StructuredOutputSpec.json_schema(SCHEMAS[kind]), **common
  ), kind


def _check(kind: str, output) -> None:
  assert output.finish_reason == "stop", (kind, output.finish_reason, output.text)
  if kind == "regex":
    assert_regex(output.text)
  elif kind == "choice":
    assert output.text in CHOICES
  else:
    assert_valid_json(output.text, SCHEMAS[kind])


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_every_output_is_valid_and_unconstrained_tokens_are_unchanged(checkpoint, async_scheduling):
  """Greedy and sampled constrained requests, n = 4 (one matcher each), chunked prefill (8
  tokens a step) and a pool small enough to preempt, beside unconstrained requests whose tokens
  must equal those of a run without the constrained ones."""
  engine = small_engine(
    checkpoint,
    max_model_len=256,
    num_pages=24,
    page_size=8,
    max_tokens_per_step=8,
    token_buckets=(8,),
    seq_buckets=(2, 8),
    async_scheduling=async_scheduling,
    warmup="full",  # every program before the run, which then compiles none
    prefix_caching=False,
  )
  compiled = engine.ledger.num_compilations
  plain = [
    SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    SamplingParams(temperature=0.9, seed=7, max_tokens=24, ignore_eos=True),
  ]
  for i, params in enumerate(plain):
    engine.add_request(PROMPTS[i], params, request_id=f"alone-{i}")
  alone = run_to_completion(engine)
  kinds = {}
  for i in range(8):
    params, kind = _constrained(i, temperature=0.0 if i < 4 else 1.0)
    for k, child in enumerate(params.replace(n=4 if i == 4 else 1).expand_n()):
      kinds[engine.add_request(PROMPTS[i % 4], child, request_id=f"c-{i}-{k}")] = kind
    if i == 2:
      for j, plain_params in enumerate(plain):
        engine.add_request(PROMPTS[j], plain_params, request_id=f"mixed-{j}")
  finished = run_to_completion(engine)
  for request_id, kind in kinds.items():
    _check(kind, finished[request_id])
  for j in range(len(plain)):
    assert finished[f"mixed-{j}"].token_ids == alone[f"alone-{j}"].token_ids
  assert engine.stats().num_preemptions > 0, "the pool must be small enough to preempt"
  assert engine.ledger.num_compilations == compiled
  assert engine.stats().num_used_pages == 0


def test_decode_bursts_run_beside_constrained_requests(checkpoint):
  """A constrained request makes its batches single steps; outputs stay valid and the
  unconstrained request's tokens equal its tokens alone (bursts or not)."""
  engine = small_engine(checkpoint, max_model_len=256, num_scheduler_steps=4, warmup="full")
  compiled = engine.ledger.num_compilations
  plain = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
  engine.add_request(PROMPTS[0], plain, request_id="alone")
  alone = run_to_completion(engine)["alone"]
  engine.add_request(PROMPTS[0], plain, request_id="plain")
  params, kind = _constrained(0, temperature=0.0)
  engine.add_request(PROMPTS[1], params, request_id="json")
  finished = run_to_completion(engine)
  _check(kind, finished["json"])
  assert finished["plain"].token_ids == alone.token_ids
  assert engine.ledger.num_compilations == compiled


def test_max_tokens_ends_a_constrained_request_with_length(checkpoint):
  engine = small_engine(checkpoint, max_model_len=256)
  params = SamplingParams(
    temperature=0.0,
    max_tokens=3,
    structured_outputs=StructuredOutputSpec.json_schema(SCHEMAS["person"]),
  )
  engine.add_request(PROMPTS[0], params, request_id="short")
  output = run_to_completion(engine)["short"]
  assert output.finish_reason == "length" and len(output.token_ids) == 3


@pytest.mark.parametrize(
  "constraint,param",
  [
    ({"regex": "(("}, "structured_outputs.regex"),
    ({"grammar": "start: undefined_rule"}, "structured_outputs.grammar"),
    (
      {"json": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}},
      "structured_outputs.json",
    ),
  ],
)
def test_a_bad_constraint_is_refused_at_admission_naming_its_field(checkpoint, constraint, param):
  engine = small_engine(checkpoint, max_model_len=256)
  with pytest.raises(StructuredOutputError) as error:
    engine.add_request(PROMPTS[0], SamplingParams(structured_outputs=constraint))
  assert error.value.param == param
  assert not engine.has_unfinished_requests()
  assert engine.stats().num_used_pages == 0


def test_a_grammar_dead_end_ends_the_request_with_grammar_error(checkpoint):
  """A token the grammar rejects (the mask never lets one through; here it is appended by hand)
  ends the request with finish_reason "grammar_error", never a hang."""
  engine = small_engine(checkpoint, max_model_len=256)
  params = SamplingParams(structured_outputs={"regex": "[0-9]+"})
  matcher = engine.constraints.matcher_for(params)
  request = Request("r", engine.tokenizer.encode("x"), params, seed=0, num_output_placeholders=1)
  state = RequestState(request, 256, True, matcher=matcher)
  letter = engine.tokenizer.encode("a", add_special_tokens=False)[0]
  assert state.append_token(letter, None) is RequestStatus.FINISHED_GRAMMAR_ERROR
  assert "dead end" in state.error
  assert RequestStatus.FINISHED_GRAMMAR_ERROR.value == "grammar_error"


def test_randomized_mixed_workload_compiles_nothing_after_warmup(checkpoint):
  engine = small_engine(checkpoint, max_model_len=256, num_pages=96, warmup="full")
  compiled = engine.ledger.num_compilations
  rng = np.random.default_rng(3)
  pending = []
  for i in range(40):
    if rng.random() < 0.5:
      params, kind = _constrained(int(rng.integers(0, 4)), float(rng.choice([0.0, 0.8])))
      if rng.random() < 0.3:
        params = params.replace(logprobs=2)
    else:
      params, kind = (
        SamplingParams(
          temperature=float(rng.choice([0.0, 0.8])),
          max_tokens=int(rng.integers(1, 30)),
          repetition_penalty=float(rng.choice([1.0, 1.2])),
        ),
        None,
      )
    pending.append((PROMPTS[i % 4], params, kind))
  kinds, finished = {}, {}
  while pending or engine.has_unfinished_requests():
    for _ in range(int(rng.poisson(1.5))):
      if pending:
        prompt, params, kind = pending.pop()
        kinds[engine.add_request(prompt, params)] = kind
    finished.update({o.request_id: o for o in engine.step() if o.finished})
  assert len(finished) == 40
  for request_id, kind in kinds.items():
    if kind is not None:
      _check(kind, finished[request_id])
  assert engine.ledger.num_compilations == compiled


def test_llm_generate_with_structured_outputs_gives_each_choice_its_matcher(checkpoint):
  from jaxserve.entrypoints.llm import LLM
  from tests.integration.engine_helpers import small_config

  llm = LLM(checkpoint, config=small_config(checkpoint, max_model_len=256), show_progress=False)
  params = SamplingParams(
    n=3,
    temperature=1.0,
    seed=11,
    max_tokens=MAX_TOKENS,
    structured_outputs={"json": SCHEMAS["points"]},
  )
  results = llm.generate([PROMPTS[0], PROMPTS[1]], params, use_tqdm=False)
  texts = [completion.text for result in results for completion in result.outputs]
  assert len(texts) == 6 and len(set(texts)) > 1  # n > 1 diverges: one matcher per choice
  for result in results:
    for completion in result.outputs:
      _check("points", completion)
  with pytest.raises(ValueError, match="structured_outputs.regex"):
    llm.generate(PROMPTS[0], SamplingParams(structured_outputs={"regex": "(("}), use_tqdm=False)


def test_the_mask_is_filled_while_the_forward_runs(checkpoint):
  """With async scheduling a constrained step's forward is dispatched before the host takes the
  step before's tokens and fills the mask; its sampler follows with the mask in its batch."""
  engine = small_engine(checkpoint, max_model_len=256)
  events = []
  runner = engine.runner

  def recorded(name, method, *args):
    events.append(name)
    return method(*args)

  for name in ("dispatch", "dispatch_sample", "fetch"):
    setattr(runner, name, functools.partial(recorded, name, getattr(runner, name)))
  fill = engine.constraints.fill
  engine.constraints.fill = lambda *args: events.append("fill") or fill(*args)
  params, kind = _constrained(2, temperature=0.0)
  engine.add_request(PROMPTS[0], params.replace(max_tokens=6), request_id="regex")
  finished = run_to_completion(engine)
  assert finished["regex"].token_ids
  letters = {"dispatch": "D", "fetch": "F", "fill": "M", "dispatch_sample": "S"}
  order = "".join(letters[e] for e in events)
  # the first step: forward, mask, sampler; then forward(N+1), fetch(N), mask(N+1), sampler(N+1)
  assert order.startswith("DMS") and "DFMS" in order, order
