"""POST /v1/completions: text completion, streaming or not, with echo and logprobs.

Streaming sends a chunk per choice per engine step that produced tokens, text or not
(server/stream_interval.py); the chunk of a choice's last step carries its finish_reason.
stream_options.continuous_usage_stats (with include_usage) puts `usage` on every chunk: the
choice's prompt tokens and its tokens so far.

Prompt scoring as lm-evaluation-harness's local-completions backend does it: `echo: true,
logprobs: N, max_tokens: 0` returns the prompt's tokens and logprobs (the first null). The
engine has no zero-token request, so it runs with prompt logprobs and max_tokens 1 and the
generated token is dropped (finish_reason "length", completion_tokens 0).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from jaxserve.api.outputs import RequestOutput
from jaxserve.core.streams import EngineDeadError, OutputStream
from jaxserve.engine.core_io import EngineCoreRequest
from jaxserve.server.drain import stream_error
from jaxserve.server.errors import bad_request
from jaxserve.server.generation import (
  DONE_EVENT,
  EngineStreamResponse,
  collect,
  expand_requests,
  sse_event,
)
from jaxserve.server.json_body import read_json
from jaxserve.server.logprobs import CompletionLogprobs, completion_logprobs
from jaxserve.server.prompt_length import PromptBudget, encode_prompt
from jaxserve.server.protocol import CompletionRequest, parse_completion_request
from jaxserve.server.state import ServingState
from jaxserve.server.stream_interval import StepCoalescer


@dataclass(frozen=True)
class TokenizedPrompt:
  text: str
  token_ids: tuple[int, ...]  # its requests' own (EngineCoreRequest.prompt_token_ids)


async def create_completion(request: Request) -> Response:
  state: ServingState = request.app.state.serving
  body = await read_json(request)
  state.check_model(body)
  try:
    parsed = parse_completion_request(body, state.config.max_logprobs, state.generation_defaults)
    state.check_n(parsed.params.n)
  except ValueError as err:
    raise bad_request(err) from err
  state.check_serving()
  try:
    response_id = f"cmpl-{uuid.uuid4().hex}"
    prompts, records = await state.run_blocking(_prepare, state, parsed, response_id)
    stream = await state.add(records)
  except ValueError as err:
    raise bad_request(err) from err
  view = CompletionView(state, parsed, response_id, prompts, [r.request_id for r in records])
  if parsed.stream:
    return EngineStreamResponse(view.events(stream), stream, state.metrics)
  finals = await collect(stream, request.receive, state.metrics)
  return JSONResponse(view.response(finals))


def _prepare(
  state: ServingState, parsed: CompletionRequest, response_id: str
) -> tuple[list[TokenizedPrompt], list[EngineCoreRequest]]:
  """Each prompt's text and ids, and the call's engine core requests; a prompt too long for the
  context is refused first, a text before it is tokenized in full (server/prompt_length.py), a
  token-id prompt's ids checked (expand_requests) before they are detokenized."""
  prompts = parsed.prompts
  budget = PromptBudget(state.max_model_len, parsed.params.max_tokens)
  encoded: list[Sequence[int]] = []
  for prompt in prompts:
    if isinstance(prompt, str):
      encoded.append(encode_prompt(state.tokenizer, prompt, budget))
    else:
      budget.check(len(prompt))
      encoded.append(prompt)
  records = expand_requests(response_id, encoded, parsed.params, state.vocab_size, parsed.priority)
  n = parsed.params.n
  return [
    TokenizedPrompt(
      prompt if isinstance(prompt, str) else state.tokenizer.decode(ids),
      ids,
    )
    for prompt, ids in zip(prompts, (r.prompt_token_ids for r in records[::n]), strict=True)
  ], records


class CompletionView:
  """Turns engine outputs into OpenAI completion bodies and chunks."""

  def __init__(
    self,
    state: ServingState,
    parsed: CompletionRequest,
    response_id: str,
    prompts: list[TokenizedPrompt],
    request_ids: list[str],
  ):
    self.state, self.parsed, self.response_id = state, parsed, response_id
    self.prompts = prompts
    self.created = int(time.time())
    self.index = {rid: i for i, rid in enumerate(request_ids)}
    self._started: set[int] = set()
    self._text_length: dict[int, int] = {}

  def _prompt_of(self, index: int) -> TokenizedPrompt:
    return self.prompts[index // self.parsed.params.n]

  def _envelope(self, choices: list[dict]) -> dict:
    return {
      "id": self.response_id,
      "object": "text_completion",
      "created": self.created,
      "model": self.state.model_name,
      "choices": choices,
    }

  def usage(self, completion_tokens: int) -> dict:
    prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
    return {
      "prompt_tokens": prompt_tokens,
      "completion_tokens": completion_tokens,
      "total_tokens": prompt_tokens + completion_tokens,
    }

  def _num_generated(self, output: RequestOutput) -> int:
    return 0 if self.parsed.score_only else len(output.token_ids)

  # -- one delta (streaming) or everything (final) ---------------------------------------
  def _choice(self, index: int, output: RequestOutput, *, delta: bool) -> dict:
    """The choice of a chunk (delta: this output's tokens, whose text may be empty while the
    detokenizer holds it back) or of the final body."""
    parsed, prompt = self.parsed, self._prompt_of(index)
    text, logprobs = "", CompletionLogprobs()
    if parsed.echo and index not in self._started:
      text = prompt.text
      if parsed.logprobs is not None and output.prompt_logprobs is not None:
        logprobs = completion_logprobs(
          self.state.tokenizer, prompt.token_ids, output.prompt_logprobs, 0
        )
    self._started.add(index)
    if not parsed.score_only:
      new_text = output.new_text if delta else output.text
      entries = (output.new_logprobs if delta else output.logprobs) or ()
      if parsed.logprobs is not None:
        offset = self._text_length.get(index, 0) + len(text)
        more = completion_logprobs(
          self.state.tokenizer, [e.token_id for e in entries], entries, offset
        )
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
          getattr(logprobs, name).extend(getattr(more, name))
      text += new_text
    self._text_length[index] = self._text_length.get(index, 0) + len(text)
    finish_reason = (
      ("length" if parsed.score_only else output.finish_reason) if output.finished else None
    )
    return {
      "index": index,
      "text": text,
      "logprobs": logprobs.to_json() if parsed.logprobs is not None else None,
      "finish_reason": finish_reason,
    }

  def response(self, finals: dict[str, RequestOutput]) -> dict:
    ordered = sorted(finals.items(), key=lambda item: self.index[item[0]])
    choices = [self._choice(self.index[rid], out, delta=False) for rid, out in ordered]
    body = self._envelope(choices)
    body["usage"] = self.usage(sum(self._num_generated(out) for _, out in ordered))
    return body

  def _chunk(self, output: RequestOutput) -> dict:
    """One choice's chunk; with continuous usage, its usage so far (its prompt's tokens and its
    own), as vLLM reports it."""
    index = self.index[output.request_id]
    body = self._envelope([self._choice(index, output, delta=True)])
    if self.parsed.continuous_usage:
      prompt_tokens = len(self._prompt_of(index).token_ids)
      completion_tokens = self._num_generated(output)
      body["usage"] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
      }
    return body

  async def events(self, stream: OutputStream) -> AsyncIterator[str]:
    observe = self.state.metrics.observer(stream.engine_index)
    coalescer = StepCoalescer(self.state.config.stream_interval)
    num_generated = 0
    try:
      while not stream.finished:
        output = await stream.get()
        observe(output)
        if output.finished:
          num_generated += self._num_generated(output)
        if (output := coalescer.push(output)) is not None:
          yield sse_event(self._chunk(output))
      if self.parsed.include_usage:
        yield sse_event({**self._envelope([]), "usage": self.usage(num_generated)})
    except EngineDeadError as err:  # the engine died, or the drain timeout ended the stream
      yield stream_error(err).sse_event()
    yield DONE_EVENT
