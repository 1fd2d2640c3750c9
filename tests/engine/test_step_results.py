"""engine/step_results.py by hand: a step's StepOutput (numpy, as the device side returns it)
applied to the requests of the batch it ran. Rows are skipped when their request finished or was
replaced while the step ran; prompt rows record prompt logprobs at the right positions; a burst
stops a request at its stop token and drops what came after. No jax, no engine."""

from __future__ import annotations

import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.engine.request_state import RequestState
from jaxserve.engine.step_results import apply_step_output
from jaxserve.messages.scheduled_batch import ScheduledBatch
from jaxserve.messages.step_output import StepOutput


def _state(request_id: str, prompt: list[int], **params) -> RequestState:
  request = Request(request_id, prompt, SamplingParams(**params), seed=0, eos_token_ids=(0,))
  request.status = RequestStatus.RUNNING
  return RequestState(request, max_model_len=64)


def _scheduled(*states: RequestState, steps: int = 1) -> None:
  """What the scheduler does for a sampling row: a placeholder per token the step samples."""
  for state in states:
    state.request.num_output_placeholders += steps


def _output(token_ids, logprobs, **parts) -> StepOutput:
  fields = dict.fromkeys(
    ("top_ids", "top_logprobs", "prompt_logprobs", "prompt_top_ids", "prompt_top_logprobs")
  )
  fields.update(parts)
  return StepOutput(np.array(token_ids, np.int32), np.array(logprobs, np.float32), **fields)


class Finishes:
  """The core's finish callback: records (request id, status) and sets the status."""

  def __init__(self):
    self.calls: list[tuple[str, RequestStatus]] = []

  def __call__(self, state: RequestState, status: RequestStatus) -> None:
    self.calls.append((state.request.request_id, status))
    state.request.status = status


def test_a_decode_row_a_prompt_chunk_and_a_dropped_row():
  decoding = _state("d", [5, 6, 7], max_tokens=4, logprobs=1)
  _scheduled(decoding)
  decoding.request.append_sampled(9)  # one token so far; this step feeds it
  prompt = _state("p", [11, 12, 13, 14, 15], max_tokens=4, prompt_logprobs=1)
  aborted = _state("a", [3, 4], max_tokens=4)
  aborted.request.status = RequestStatus.FINISHED_ABORTED  # while the step ran
  _scheduled(decoding, aborted)
  batch = ScheduledBatch(
    request_ids=("d", "a", "p"),
    start_positions=(3, 1, 0),
    query_lens=(1, 1, 3),  # the prompt's first chunk: positions 0-2, not yet sampling
    sample=(True, True, False),
  )
  # rows: d samples 21, a (dropped) 22, p nothing; tokens: d's 1, a's 1, p's 3
  host = _output(
    [21, 22, 23],
    [-0.5, -1.5, -2.5],
    top_ids=np.array([[21], [22], [23]], np.int32),
    top_logprobs=np.array([[-0.5], [-1.5], [-2.5]], np.float32),
    prompt_logprobs=np.array([-9.0, -9.0, -1.0, -2.0, -3.0], np.float32),
    prompt_top_ids=np.array([[1], [1], [12], [13], [99]], np.int32),
    prompt_top_logprobs=np.array([[-0.125], [-0.125], [-0.25], [-0.375], [-0.5]], np.float32),
  )
  states = {"d": decoding, "p": prompt, "a": aborted}
  finishes = Finishes()
  touched = apply_step_output(
    batch, [decoding.request, aborted.request, prompt.request], host, states, finishes
  )
  assert touched == [decoding]  # the prompt row samples nothing, the aborted one is dropped
  assert decoding.request.output_token_ids == [9, 21]
  (logprob,) = decoding._new_logprobs
  assert (logprob.token_id, logprob.logprob, logprob.top) == (21, -0.5, ((21, -0.5),))
  assert aborted.request.output_token_ids == [] and finishes.calls == []
  # the prompt chunk's tokens 2-4 of the step (cursor past d's and a's) score prompt tokens
  # 1-3: position j's logprob is that of prompt[j + 1]
  recorded = [(e.token_id, e.logprob) if e else None for e in prompt.prompt_logprobs]
  assert recorded == [None, (12, -1.0), (13, -2.0), (14, -3.0), None]
  assert prompt.prompt_logprobs[1].top == ((12, -0.25),)


def test_a_replaced_request_with_the_same_id_gets_nothing():
  old = _state("r", [1, 2], max_tokens=4)
  new = _state("r", [1, 2], max_tokens=4)  # the id reused after old was stopped
  _scheduled(old, new)
  batch = ScheduledBatch(("r",), (2,), (1,), (True,))
  touched = apply_step_output(batch, [old.request], _output([7], [-1.0]), {"r": new}, Finishes())
  assert touched == [] and new.request.output_token_ids == [] == old.request.output_token_ids


def test_max_tokens_finishes_through_the_callback():
  state = _state("m", [1, 2, 3], max_tokens=1)
  _scheduled(state)
  finishes = Finishes()
  batch = ScheduledBatch(("m",), (0,), (3,), (True,))
  assert apply_step_output(batch, [state.request], _output([8], [-1.0]), {"m": state}, finishes)
  assert finishes.calls == [("m", RequestStatus.FINISHED_LENGTH)]


def test_a_burst_stops_at_the_stop_token_and_drops_the_rest():
  stops = _state("s", [1, 2], max_tokens=10)  # eos 0 ends it
  runs = _state("r", [3, 4], max_tokens=10, logprobs=0)
  batch = ScheduledBatch(("s", "r"), (2, 2), (1, 1), (True, True), num_steps=3)
  _scheduled(stops, runs, steps=3)
  host = _output(
    [[5, 6], [0, 7], [9, 8]],  # [num_steps, S]: s samples 5, then eos, then 9 (dropped)
    [[-0.1, -0.2], [-0.3, -0.4], [-0.5, -0.6]],
  )
  finishes = Finishes()
  touched = apply_step_output(
    batch, [stops.request, runs.request], host, {"s": stops, "r": runs}, finishes
  )
  assert touched == [stops, runs]
  assert stops.request.output_token_ids == [5, 0] and runs.request.output_token_ids == [6, 7, 8]
  assert finishes.calls == [("s", RequestStatus.FINISHED_STOPPED)]
  assert [(e.token_id, e.logprob) for e in runs._new_logprobs] == [
    (6, np.float32(-0.2)),
    (7, np.float32(-0.4)),
    (8, np.float32(-0.6)),
  ]
  assert stops._new_logprobs == []  # it asked for none
