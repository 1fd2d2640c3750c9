"""A finished step's host results applied to the requests it ran. Pure Python, no jax.

EngineCore dispatches a step and, when its StepOutput is on the host, hands it here with the
batch it fed and each row's Request: every sampling row appends its token (and logprob) to its
RequestState, prompt rows record their prompt logprobs, and a request that reaches a stop
condition is ended through the core's `finish` callback (which tells the scheduler). A row
whose request finished or was replaced while the step ran (an abort, a stop string) is skipped:
its results are dropped. Returns the states that progressed, for the core's outputs.

Single steps: StepOutput.token_ids [S] (S the bucket's rows), logprobs [S], top_ids /
top_logprobs [S, K]; prompt_logprobs [T] and prompt_top_ids / prompt_top_logprobs [T, K'] over
the step's T tokens. Decode bursts: token_ids and logprobs [num_steps, S]; a request that
finishes within the burst drops the tokens sampled after its last one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from jaxserve.api.outputs import TokenLogprob
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.engine.request_state import RequestState
from jaxserve.messages.scheduled_batch import ScheduledBatch
from jaxserve.messages.step_output import StepOutput

Finish = Callable[[RequestState, RequestStatus], None]


def apply_step_output(
  batch: ScheduledBatch,
  requests: Sequence[Request],
  host: StepOutput,
  states: dict[str, RequestState],
  finish: Finish,
) -> list[RequestState]:
  """The step's results, row by row (a burst's step by step); the states that progressed."""
  if batch.num_steps > 1:
    return _apply_burst(batch, requests, host, states, finish)
  touched, cursor, now = [], 0, time.monotonic()
  sampled_ids = host.token_ids.tolist()
  has_prompt_logprobs = host.prompt_logprobs is not None
  for i, (request_id, request, num_tokens, sample) in enumerate(
    zip(batch.request_ids, requests, batch.query_lens, batch.sample, strict=True)
  ):
    state = _live_state(request_id, request, states, now)
    if state is None:
      cursor += num_tokens
      continue
    if has_prompt_logprobs and state.prompt_logprobs is not None:
      for j in range(num_tokens):
        _record_prompt_logprob(state, host, batch.start_positions[i] + j, cursor + j)
    cursor += num_tokens
    if not sample:
      continue
    token_id = sampled_ids[i]
    logprob = _sampled_logprob(state, host, i, token_id) if state.wants_logprobs else None
    status = state.append_token(token_id, logprob)
    if status is not None:
      finish(state, status)
    touched.append(state)
  return touched


def _apply_burst(
  batch: ScheduledBatch,
  requests: Sequence[Request],
  host: StepOutput,
  states: dict[str, RequestState],
  finish: Finish,
) -> list[RequestState]:
  touched, now = [], time.monotonic()
  sampled_ids, logprobs = host.token_ids.T.tolist(), host.logprobs.T.tolist()  # [S, steps]
  for i, (request_id, request) in enumerate(zip(batch.request_ids, requests, strict=True)):
    state = _live_state(request_id, request, states, now)
    if state is None:
      continue
    for token_id, logprob in zip(sampled_ids[i], logprobs[i], strict=True):
      status = state.append_token(
        token_id, TokenLogprob(token_id, logprob, ()) if state.wants_logprobs else None
      )
      if status is not None:
        finish(state, status)
        break
    touched.append(state)
  return touched


def _live_state(
  request_id: str, request: Request, states: dict[str, RequestState], now: float
) -> RequestState | None:
  """The state a row's results go to, its first schedule time set; None when the request was
  stopped or aborted while the step ran (its results are dropped)."""
  state = states.get(request_id)
  if request.status.finished or state is None or state.request is not request:
    return None
  if state.first_scheduled_time is None:
    state.first_scheduled_time = now
  return state


def _sampled_logprob(
  state: RequestState, host: StepOutput, row: int, token_id: int
) -> TokenLogprob | None:
  num_top = state.request.sampling_params.logprobs
  if num_top is None:
    return None
  top = ()
  if num_top > 0 and host.top_ids is not None:
    top = tuple(
      (int(t), float(lp))
      for t, lp in zip(host.top_ids[row, :num_top], host.top_logprobs[row, :num_top], strict=True)
    )
  return TokenLogprob(token_id, float(host.logprobs[row]), top)


def _record_prompt_logprob(
  state: RequestState, host: StepOutput, position: int, token_index: int
) -> None:
  prompt = state.request.prompt_token_ids
  if position + 1 >= len(prompt) or state.prompt_logprobs[position + 1] is not None:
    return
  num_top = state.request.sampling_params.prompt_logprobs
  top = tuple(
    (int(t), float(lp))
    for t, lp in zip(
      host.prompt_top_ids[token_index, :num_top],
      host.prompt_top_logprobs[token_index, :num_top],
      strict=True,
    )
  )
  state.record_prompt_logprob(
    position, TokenLogprob(prompt[position + 1], float(host.prompt_logprobs[token_index]), top)
  )
