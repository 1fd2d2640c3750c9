"""EngineCore's own inputs and outputs: a tokenized request in, a request's tokens of one step
out (token ids, logprobs, finish reason; no text). The in-process LLMEngine hands the outputs to
its OutputProcessor unchanged; the engine core process sends them to its clients inside
core/messages.py's StepOutputs.

EngineCoreRequest is THE record of a request across the wire: the API server (server/
generation.py) or the offline LLMEngine builds it once, with new_core_requests (the one
construction site: tests/architecture/test_request_record.py), where the prompt's ids become
one tuple, checked once (engine/admission.check_token_ids), which every choice of the prompt
shares; the client sends it as it is, the output processor keeps it as its request's
(engine/output_processor.py) and the core makes its scheduling state from it
(engine/request.Request shares the tuple), so no layer copies or checks the ids again.
EngineCore.add_request applies the rules that need the core (the policy, the context, the
grammar), not the ids'.

msgspec Structs like core/messages.py's (docs/DECISIONS.md, "msgspec Structs for the core's
messages"), `array_like` (fields by position on the wire) and `gc=False` (they hold no cycles).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from jaxserve.api.outputs import FinishReason, TokenLogprob
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.engine.admission import check_token_ids


class EngineCoreRequest(msgspec.Struct, frozen=True, array_like=True, gc=False):
  """One tokenized request (build it with new_core_requests). stream=False: the caller wants the
  final output only."""

  request_id: str
  prompt_token_ids: tuple[int, ...]
  params: SamplingParams
  arrival_time: float
  stream: bool = True
  priority: int = 0  # scheduler.policy "priority": lower first (engine/request_queue.py)


def new_core_requests(
  request_ids: Sequence[str],
  prompt_token_ids: Sequence[int],
  params: Sequence[SamplingParams],
  vocab_size: int,
  *,
  arrival_time: float,
  stream: bool = True,
  priority: int = 0,
  field: str = "prompt",
) -> list[EngineCoreRequest]:
  """The records of one prompt's choices, request_ids[i] sampling with params[i] (n > 1 expanded
  by the caller: SamplingParams.expand_n): the ids checked once, ValueError naming `field` if
  empty or out of [0, vocab_size), and made one tuple that every record shares."""
  if len(prompt_token_ids) == 0:
    raise ValueError(f"{field}: must not be empty")
  ids = check_token_ids(prompt_token_ids, vocab_size, field)
  return [
    EngineCoreRequest(request_id, ids, p, arrival_time, stream, priority)
    for request_id, p in zip(request_ids, params, strict=True)
  ]


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
