"""The engine core's per-request output tracking: token-level stop checks, logprobs, timings.

The scheduler owns a request's pages and progress; this owns what the core reports after each
step: the new token ids and logprobs, and whether a stop token, max_tokens or max_model_len ended
the request. Text (detokenization, stop strings) is the output processor's
(engine/output_processor.py), wherever it runs. Pure Python.

A constrained request (structured outputs) carries its grammar matcher, which consumes each
appended token: a grammar at a dead end ends the request with "grammar_error" (never a hang);
a complete grammar lets only eos through the next mask, so the request ends with "stop" on that
eos (ignore_eos too), whose text, like any stop token's, is dropped; max_tokens still ends it
with "length".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from jaxserve.api.outputs import TokenLogprob
from jaxserve.engine.core_io import EngineCoreOutput
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.structured import GrammarState, SequenceMatcher


@dataclass(eq=False)
class RequestState:
  request: Request
  max_model_len: int
  stream: bool = True  # False: report the request only when it finishes
  prompt_logprobs: list[TokenLogprob | None] | None = None
  first_scheduled_time: float | None = None
  first_token_time: float | None = None
  last_token_time: float | None = None
  finished_time: float | None = None
  stop_reason: int | None = None
  error: str | None = None
  _new_token_ids: list[int] = field(default_factory=list)
  _new_logprobs: list[TokenLogprob] = field(default_factory=list)
  _prompt_logprobs_sent: bool = False
  matcher: SequenceMatcher | None = None  # the grammar of a constrained request

  def __post_init__(self) -> None:
    params = self.request.sampling_params
    if params.prompt_logprobs is not None:
      self.prompt_logprobs = [None] * self.request.num_prompt_tokens
    # every token that can stop the request (eos unless ignored, stop_token_ids): one lookup
    self._stop_token_ids = frozenset(
      () if params.ignore_eos else self.request.eos_token_ids
    ) | frozenset(params.stop_token_ids)
    self.wants_logprobs = params.logprobs is not None

  def record_prompt_logprob(self, position: int, entry: TokenLogprob) -> None:
    """Logprob of prompt token position + 1 given tokens 0..position."""
    if self.prompt_logprobs is not None and position + 1 < len(self.prompt_logprobs):
      self.prompt_logprobs[position + 1] = entry

  def append_token(self, token_id: int, logprob: TokenLogprob | None) -> RequestStatus | None:
    """Adds a sampled token; returns the finished status if the request should stop."""
    now = time.monotonic()
    self.first_token_time = self.first_token_time or now
    self.last_token_time = now
    request, params = self.request, self.request.sampling_params
    request.append_sampled(token_id)
    self._new_token_ids.append(token_id)
    if logprob is not None:
      self._new_logprobs.append(logprob)
    num_output = len(request.output_token_ids)
    if token_id in self._stop_token_ids and num_output >= params.min_tokens:
      eos = not params.ignore_eos and token_id in request.eos_token_ids
      self.stop_reason = None if eos else token_id
      return RequestStatus.FINISHED_STOPPED
    if self.matcher is not None:
      status = self._advance_grammar(token_id)
      if status is not None:
        return status
    if num_output >= params.max_tokens or request.num_tokens >= self.max_model_len:
      return RequestStatus.FINISHED_LENGTH
    return None

  def _advance_grammar(self, token_id: int) -> RequestStatus | None:
    """Consumes the token; the status the grammar ends the request with, if it does."""
    matcher = self.matcher
    if not matcher.consume([token_id]) or matcher.state is GrammarState.DEAD_END:
      self.error = f"structured_outputs: the grammar reached a dead end: {matcher.error}"
      return RequestStatus.FINISHED_GRAMMAR_ERROR
    if matcher.state is GrammarState.FINISHED and token_id in self.request.eos_token_ids:
      return RequestStatus.FINISHED_STOPPED  # eos under ignore_eos: the grammar still ends it
    return None

  def make_output(self) -> EngineCoreOutput:
    """The delta since the last call (which it then clears)."""
    request = self.request
    finished = request.status.finished
    prompt_logprobs = None
    if (
      self.prompt_logprobs is not None
      and not self._prompt_logprobs_sent
      and (self._new_token_ids or finished)
    ):
      prompt_logprobs, self._prompt_logprobs_sent = self.prompt_logprobs, True
    output = EngineCoreOutput(
      request.request_id,
      self._new_token_ids,
      self._new_logprobs if self.wants_logprobs else None,
      request.status.value if finished else None,
      self.stop_reason,
      prompt_logprobs,
      self.first_scheduled_time,
      self.first_token_time,
      self.last_token_time,
      self.finished_time,
      request.num_preemptions,
      self.error,
    )
    self._new_token_ids, self._new_logprobs = [], []
    return output
