"""EngineCore's own inputs and outputs: a tokenized request in, a request's tokens of one step
out (token ids, logprobs, finish reason; no text). The in-process LLMEngine hands the outputs to
its OutputProcessor unchanged; the engine core process sends them to its clients inside
core/messages.py's StepOutputs.

msgspec Structs like core/messages.py's (docs/DECISIONS.md, "msgspec Structs for the core's
messages"), `array_like` (fields by position on the wire) and `gc=False` (they hold no cycles).
"""

from __future__ import annotations

import msgspec

from jaxserve.outputs import FinishReason, TokenLogprob
from jaxserve.sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, frozen=True, array_like=True, gc=False):
  """One tokenized request. stream=False: the caller wants the final output only."""

  request_id: str
  prompt_token_ids: list[int]
  params: SamplingParams
  arrival_time: float
  stream: bool = True
  priority: int = 0  # scheduler.policy "priority": lower first (engine/request_queue.py)


class EngineCoreOutput(msgspec.Struct, array_like=True, gc=False):
  """A request's tokens from one step (a burst's several, or, for a request that streams
  nothing, all of them at the end). finish_reason: STOP (a stop token, then the last of
  new_token_ids and stop_reason its id, None for eos), LENGTH, ABORT, ERROR or GRAMMAR_ERROR;
  stop strings are the output processor's. prompt_logprobs come once, with the request's first
  output."""

  request_id: str
  new_token_ids: list[int]
  new_logprobs: list[TokenLogprob] | None
  finish_reason: FinishReason | None
  stop_reason: int | None
  prompt_logprobs: list[TokenLogprob | None] | None
  first_scheduled_time: float | None
  first_token_time: float | None
  last_token_time: float | None
  finished_time: float | None
  num_preemptions: int
  error: str | None = None
