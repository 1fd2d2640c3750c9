"""The output processor: the engine core's token-level outputs -> RequestOutputs with text.

One owner of what the user sees of a request: incremental detokenization, stop strings and the
RequestOutput (cumulative tokens, text and logprobs, plus this step's delta). The in-process
LLMEngine (LLM.generate) runs it on the engine core's outputs directly; the API servers of
`jaxserve serve` run it on the outputs the engine core sends them (core/client.py). A stop string
found here ends the request: its tokens past the one that completed it are dropped, and process()
names it so the caller stops it in the core (EngineCore.stop_request, or an
AbortRequests(stopped=True) message).

A request that neither streams nor has stop strings is detokenized once, when it finishes.

A request is tracked by its id, with the record the caller sent the core (engine/core_io.py's
EngineCoreRequest) as it is: its prompt ids are the RequestOutputs' prompt_token_ids, never
copied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from jaxserve.api.outputs import FinishReason, RequestMetrics, RequestOutput, TokenLogprob
from jaxserve.engine.core_io import EngineCoreOutput, EngineCoreRequest
from jaxserve.tokenizer.detokenizer import IncrementalDetokenizer
from jaxserve.tokenizer.tokenizer import Tokenizer

# looked up once (an enum attribute lookup is slow, and these checks run for every output)
_STOP = FinishReason.STOP
_FLUSHES_TEXT = (FinishReason.STOP, FinishReason.LENGTH)  # the core's ends that flush the text


@dataclass(eq=False)
class _Tracked:
  """One request's text side: its record and what it has produced."""

  request: EngineCoreRequest
  detokenizer: IncrementalDetokenizer
  token_ids: list[int] = field(default_factory=list)
  logprobs: list[TokenLogprob] | None = None
  prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None

  def __post_init__(self) -> None:
    # Without streaming and stop strings nobody needs text before the end: detokenize once then.
    request = self.request
    self.stream = request.stream
    self.deferred_text = not request.stream and not request.params.stop
    if request.params.logprobs is not None:
      self.logprobs = []

  def apply(self, out: EngineCoreOutput) -> tuple[RequestOutput | None, bool]:
    """This step's RequestOutput (None when nobody wants it yet) and whether a stop string
    ended the request here while the core still runs it."""
    ids, new_logprobs = out.new_token_ids, out.new_logprobs
    finish_reason, stop_reason = out.finish_reason, out.stop_reason
    if out.prompt_logprobs is not None:
      self.prompt_logprobs = tuple(out.prompt_logprobs)
    # a stop token (finish STOP from the core) ends the output but is not part of the text
    text_ids = ids[:-1] if finish_reason == _STOP else ids
    new_text: list[str] = []
    stopped_here = False
    if not self.deferred_text:
      for j, token_id in enumerate(text_ids):
        delta = self.detokenizer.add_tokens((token_id,))
        new_text.append(delta.text)
        if delta.stop_string is not None:
          ids = ids[: j + 1]
          new_logprobs = new_logprobs[: j + 1] if new_logprobs is not None else None
          stopped_here = finish_reason is None
          finish_reason, stop_reason = _STOP, delta.stop_string
          break
    self.token_ids.extend(ids)
    if self.logprobs is not None and new_logprobs is not None:
      self.logprobs.extend(new_logprobs)
    if finish_reason in _FLUSHES_TEXT and not isinstance(stop_reason, str):
      if self.deferred_text:
        ended_by_token = finish_reason == _STOP
        new_text.append(
          self.detokenizer.add_tokens(
            self.token_ids[:-1] if ended_by_token else self.token_ids
          ).text
        )
      new_text.append(self.detokenizer.flush())
      if self.detokenizer.stop_string is not None:  # completed by the text flushed at the end
        finish_reason, stop_reason = _STOP, self.detokenizer.stop_string
    finished = finish_reason is not None
    if not (self.stream or finished):
      return None, stopped_here
    want_logprobs = self.logprobs is not None
    output = RequestOutput(
      request_id=out.request_id,
      prompt_token_ids=self.request.prompt_token_ids,
      token_ids=tuple(self.token_ids),
      text=self.detokenizer.output_text,
      new_token_ids=tuple(ids),
      new_text="".join(new_text),
      finished=finished,
      finish_reason=finish_reason,
      stop_reason=stop_reason,
      logprobs=tuple(self.logprobs) if want_logprobs else None,
      new_logprobs=tuple(new_logprobs or ()) if want_logprobs else None,
      prompt_logprobs=self.prompt_logprobs,
      metrics=RequestMetrics(
        self.request.arrival_time,
        out.first_scheduled_time,
        out.first_token_time,
        out.last_token_time,
        out.finished_time,
        out.num_preemptions,
      ),
      error=out.error,
    )
    return output, stopped_here


class OutputProcessor:
  """The text side of every request of one client (see the module docstring)."""

  def __init__(self, tokenizer: Tokenizer):
    self.tokenizer = tokenizer
    self._requests: dict[str, _Tracked] = {}

  def add_request(self, request: EngineCoreRequest) -> None:
    params = request.params
    detokenizer = IncrementalDetokenizer(
      self.tokenizer,
      request.prompt_token_ids,
      skip_special_tokens=params.skip_special_tokens,
      stop=params.stop,
      include_stop_str_in_output=params.include_stop_str_in_output,
      min_tokens=params.min_tokens,
    )
    self._requests[request.request_id] = _Tracked(request, detokenizer)

  def remove(self, request_id: str) -> None:
    """Forgets a request (its add failed in the core, or nobody listens any more)."""
    self._requests.pop(request_id, None)

  @property
  def num_requests(self) -> int:
    return len(self._requests)

  def process(self, outputs: Iterable[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
    """The RequestOutputs of a step, and the ids of the requests a stop string ended, which the
    core still runs. Outputs of requests it does not know (finished here already) are
    dropped."""
    results, stopped = [], []
    requests = self._requests
    for out in outputs:
      tracked = requests.get(out.request_id)
      if tracked is None:
        continue
      output, stopped_here = tracked.apply(out)
      if stopped_here:
        stopped.append(out.request_id)
      if output is not None:
        results.append(output)
        if output.finished:
          del requests[out.request_id]
    return results, stopped
