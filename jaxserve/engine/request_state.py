"""Host-side output tracking of one request: text, logprobs, stop checks and timings.

The scheduler owns a request's pages and progress; this owns what the user sees. Pure Python.

A constrained request (structured outputs) carries its grammar matcher, which consumes each
appended token: a grammar that is complete ends the request ("stop", without spending a step on
eos), one at a dead end ends it with "grammar_error"; max_tokens still ends it with "length".
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from jaxserve.engine.request import Request, RequestStatus
from jaxserve.outputs import RequestMetrics, RequestOutput, TokenLogprob
from jaxserve.structured import GrammarState, SequenceMatcher
from jaxserve.tokenizer.detokenizer import IncrementalDetokenizer


@dataclass(eq=False)
class RequestState:
  request: Request
  detokenizer: IncrementalDetokenizer
  max_model_len: int
  stream: bool = True   # False: only the final output is wanted (offline API)
  matcher: SequenceMatcher | None = None  # the grammar of a constrained request
  logprobs: list[TokenLogprob] = field(default_factory=list)
  prompt_logprobs: list[TokenLogprob | None] | None = None
  first_scheduled_time: float | None = None
  first_token_time: float | None = None
  last_token_time: float | None = None
  finished_time: float | None = None
  stop_reason: str | int | None = None
  error: str | None = None
  _new_token_ids: list[int] = field(default_factory=list)
  _new_text: list[str] = field(default_factory=list)
  _new_logprobs: list[TokenLogprob] = field(default_factory=list)

  def __post_init__(self) -> None:
    if self.request.sampling_params.prompt_logprobs is not None:
      self.prompt_logprobs = [None] * self.request.num_prompt_tokens
    # Without streaming and stop strings nobody needs text before the end: detokenize once then.
    self._deferred_text = not self.stream and not self.request.sampling_params.stop
    params = self.request.sampling_params
    # every token that can stop the request (eos unless ignored, stop_token_ids): one lookup
    self._stop_token_ids = (frozenset(() if params.ignore_eos else self.request.eos_token_ids)
                            | frozenset(params.stop_token_ids))
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
      self.logprobs.append(logprob)
      self._new_logprobs.append(logprob)
    num_output = len(request.output_token_ids)
    if token_id in self._stop_token_ids and num_output >= params.min_tokens:
      if not params.ignore_eos and token_id in request.eos_token_ids:
        return self._finish_text(RequestStatus.FINISHED_STOPPED, None)
      return self._finish_text(RequestStatus.FINISHED_STOPPED, token_id)
    grammar_status = self._advance_grammar(token_id) if self.matcher is not None else None
    if not self._deferred_text:
      delta = self.detokenizer.add_tokens([token_id])
      self._new_text.append(delta.text)
      if delta.stop_string is not None:
        self.stop_reason = delta.stop_string
        return RequestStatus.FINISHED_STOPPED
    if grammar_status is not None:
      return self._finish_text(grammar_status, None, keep_last=True)
    if num_output >= params.max_tokens or request.num_tokens >= self.max_model_len:
      return self._finish_text(RequestStatus.FINISHED_LENGTH, None)
    return None

  def _advance_grammar(self, token_id: int) -> RequestStatus | None:
    """Consumes the token; the status the grammar ends the request with, if it does."""
    if not self.matcher.consume([token_id]) or self.matcher.state is GrammarState.DEAD_END:
      self.error = f"structured_outputs: the grammar reached a dead end: {self.matcher.error}"
      return RequestStatus.FINISHED_GRAMMAR_ERROR
    if self.matcher.state is GrammarState.FINISHED:
      return RequestStatus.FINISHED_STOPPED
    return None

  def _finish_text(self, status: RequestStatus, stop_reason: str | int | None,
                   keep_last: bool = False) -> RequestStatus:
    """Ends the text; a stop token (eos or stop_token_ids) is not part of it, unless keep_last
    (the grammar ended on a text token)."""
    self.stop_reason = stop_reason
    if self._deferred_text:
      output = self.request.output_token_ids
      keep = keep_last or status is RequestStatus.FINISHED_LENGTH
      text_ids = output if keep else output[:-1]
      self._new_text.append(self.detokenizer.add_tokens(text_ids).text)
    self._new_text.append(self.detokenizer.flush())
    if self.detokenizer.stop_string is not None:  # completed only by the text flushed at the end
      self.stop_reason = self.detokenizer.stop_string
      return RequestStatus.FINISHED_STOPPED
    return status

  @property
  def wants_output(self) -> bool:
    return self.stream or self.request.status.finished

  def make_output(self) -> RequestOutput:
    """The cumulative state plus the delta since the last call (which it then clears)."""
    request = self.request
    finished = request.status.finished
    params = request.sampling_params
    want_logprobs = params.logprobs is not None
    output = RequestOutput(
        request_id=request.request_id,
        prompt_token_ids=tuple(request.prompt_token_ids),
        token_ids=tuple(request.output_token_ids),
        text=self.detokenizer.output_text,
        new_token_ids=tuple(self._new_token_ids),
        new_text="".join(self._new_text),
        finished=finished,
        finish_reason=request.status.value if finished else None,
        stop_reason=self.stop_reason,
        logprobs=tuple(self.logprobs) if want_logprobs else None,
        new_logprobs=tuple(self._new_logprobs) if want_logprobs else None,
        prompt_logprobs=(tuple(self.prompt_logprobs) if self.prompt_logprobs is not None
                         else None),
        metrics=RequestMetrics(request.arrival_time, self.first_scheduled_time,
                               self.first_token_time, self.last_token_time, self.finished_time,
                               request.num_preemptions),
        error=self.error)
    self._new_token_ids, self._new_text, self._new_logprobs = [], [], []
    return output
