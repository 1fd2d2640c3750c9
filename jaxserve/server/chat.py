"""POST /v1/chat/completions: the chat template, streaming or not, with logprobs.

The prompt is rendered with the tokenizer's chat template and encoded without adding special
tokens (the template writes bos). Without max_tokens / max_completion_tokens a reply may use
the rest of the context, max_model_len - prompt tokens, or the generation config's
max_new_tokens if that is less (jaxserve/config/generation_config.py).

Streaming opens each choice with a role chunk (then, with `echo`, a chunk of the echoed text),
then sends a chunk per engine step that produced the choice's tokens, `delta.content` empty
while the detokenizer holds text back (server/stream_interval.py); the last carries the
finish_reason (a choice whose end releases more, held text or tool calls, gets one chunk more).
stream_options.continuous_usage_stats (with include_usage) puts `usage` on every chunk: the
prompt's tokens and the choice's tokens so far.

The prompt: server/chat_prompt.py (template variables, continue_final_message). The reply:
server/chat_choices.py (reasoning_content with a --reasoning-parser, tool calls, echo); tool
calls (server/tool_calls.py) come back as `tool_calls` in the message, or as `delta.tool_calls`
streamed as the arguments are written, with finish_reason "tool_calls".
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from jaxserve.api.outputs import RequestOutput
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.core.streams import EngineDeadError, OutputStream
from jaxserve.server.chat_choices import ChatChoices, ChoiceDeltas
from jaxserve.server.chat_prompt import render_chat_prompt
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
from jaxserve.server.logprobs import chat_logprobs
from jaxserve.server.prompt_length import PromptBudget, encode_prompt
from jaxserve.server.protocol import ChatRequest, parse_chat_request
from jaxserve.server.state import ServingState
from jaxserve.server.stream_interval import StepCoalescer

# Engine and template errors name "prompt" / "chat_template"; the request's field is messages.
_RENAME = {"prompt": "messages", "chat_template": "messages"}


async def create_chat_completion(request: Request) -> Response:
  state: ServingState = request.app.state.serving
  body = await read_json(request)
  state.check_model(body)
  try:
    parsed = parse_chat_request(
      body, state.max_model_len, state.config.max_logprobs, state.generation_defaults
    )
    state.check_n(parsed.params.n)
  except ValueError as err:
    raise bad_request(err) from err
  state.check_serving()
  try:
    prompt_ids = await state.run_blocking(_encode_chat, state, parsed)
    params = _final_params(parsed, len(prompt_ids), state)
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    specs = expand_requests(response_id, [prompt_ids], params, state.vocab_size, parsed.priority)
    stream = await state.add(specs)
  except ValueError as err:
    raise bad_request(err, _RENAME) from err
  view = ChatView(state, parsed, response_id, len(prompt_ids), [s.request_id for s in specs])
  if parsed.stream:
    return EngineStreamResponse(view.events(stream), stream, state.metrics)
  finals = await collect(stream, request.receive, state.metrics)
  return JSONResponse(view.response(finals))


def _encode_chat(state: ServingState, parsed: ChatRequest) -> list[int]:
  """The rendered template's token ids (as Tokenizer.encode_chat), refused first if they
  cannot leave max_tokens, or a token, within the context (server/prompt_length.py)."""
  tools = [tool.to_openai() for tool in parsed.tools] or None
  tokenizer, defaults = state.tokenizer, state.config.default_chat_template_kwargs
  text = render_chat_prompt(tokenizer, parsed.prompt, defaults, tools)
  budget = PromptBudget(state.max_model_len, parsed.max_tokens)
  return encode_prompt(tokenizer, text, budget, add_special_tokens=False)


def _final_params(
  parsed: ChatRequest, num_prompt_tokens: int, state: ServingState
) -> SamplingParams:
  """Without max_tokens, the reply may take the rest of the context (_encode_chat left it at
  least one token)."""
  if parsed.max_tokens is not None:
    return parsed.params
  max_model_len = state.max_model_len
  room = max_model_len - num_prompt_tokens
  if room < 1:
    raise ValueError(
      f"messages: the prompt has {num_prompt_tokens} tokens, which leaves no room "
      f"for a reply within max_model_len {max_model_len}"
    )
  return parsed.params.replace(max_tokens=state.generation_defaults.max_tokens_within(room))


class ChatView:
  """Turns engine outputs into OpenAI chat completion bodies and chunks."""

  def __init__(
    self,
    state: ServingState,
    parsed: ChatRequest,
    response_id: str,
    num_prompt_tokens: int,
    request_ids: list[str],
  ):
    self.state, self.parsed, self.response_id = state, parsed, response_id
    self.num_prompt_tokens = num_prompt_tokens
    self.created = int(time.time())
    self.index = {rid: i for i, rid in enumerate(request_ids)}
    config = state.config
    self.choices = ChatChoices(parsed, config.tool_call_parser, config.reasoning_parser)
    self._deltas: dict[int, ChoiceDeltas] = {}

  def _envelope(self, choices: list[dict], obj: str) -> dict:
    return {
      "id": self.response_id,
      "object": obj,
      "created": self.created,
      "model": self.state.model_name,
      "choices": choices,
    }

  def usage(self, completion_tokens: int) -> dict:
    return {
      "prompt_tokens": self.num_prompt_tokens,
      "completion_tokens": completion_tokens,
      "total_tokens": self.num_prompt_tokens + completion_tokens,
    }

  def _logprobs(self, entries) -> dict | None:
    if not self.parsed.logprobs:
      return None
    return chat_logprobs(self.state.tokenizer, entries or ())

  def response(self, finals: dict[str, RequestOutput]) -> dict:
    ordered = sorted(finals.items(), key=lambda item: self.index[item[0]])
    choices = []
    for rid, out in ordered:
      message, finish_reason = self.choices.message(out.text, out.finish_reason)
      choices.append(
        {
          "index": self.index[rid],
          "message": message,
          "logprobs": self._logprobs(out.logprobs),
          "finish_reason": finish_reason,
        }
      )
    body = self._envelope(choices, "chat.completion")
    body["usage"] = self.usage(sum(len(out.token_ids) for _, out in ordered))
    return body

  def _chunk(
    self,
    index: int,
    delta: dict,
    num_tokens: int,
    finish_reason: str | None = None,
    logprobs: dict | None = None,
  ) -> str:
    """One choice's chunk; num_tokens: the choice's tokens so far (continuous usage)."""
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    body = self._envelope([choice], "chat.completion.chunk")
    if self.parsed.continuous_usage:
      body["usage"] = self.usage(num_tokens)
    return sse_event(body)

  def _delta_chunks(self, output: RequestOutput) -> str:
    """One output's tokens: their text (an empty content while it is held back) and logprobs;
    the last also what the choice's end releases, and its finish_reason (an aborted choice's
    last may have no tokens: {})."""
    index = self.index[output.request_id]
    num_tokens = len(output.token_ids)
    logprobs = self._logprobs(output.new_logprobs) if output.new_token_ids else None
    deltas = self._deltas.setdefault(index, self.choices.deltas())
    pieces = deltas.feed(output.new_text)
    if pieces == [{}] and output.new_token_ids and not self.choices.tools.active:
      pieces = [{"content": ""}]  # a token whose text is held back: still a chunk
    finish_reason = None
    if output.finished:
      last, finish_reason = deltas.finish(output.finish_reason)
      pieces = [p for p in pieces if p] + last if last else pieces
      pieces = pieces or [{}]
    chunks = [
      self._chunk(index, delta, num_tokens, None, logprobs if i == 0 else None)
      for i, delta in enumerate(pieces[:-1])
    ]
    first = len(pieces) == 1
    chunks.append(
      self._chunk(index, pieces[-1], num_tokens, finish_reason, logprobs if first else None)
    )
    return "".join(chunks)

  async def events(self, stream: OutputStream) -> AsyncIterator[str]:
    observe = self.state.metrics.observer(stream.engine_index)
    coalescer = StepCoalescer(self.state.config.stream_interval)
    num_generated = 0
    try:
      for index in range(len(self.index)):
        yield self._chunk(index, {"role": "assistant", "content": ""}, 0)
      if self.choices.echo:
        for index in range(len(self.index)):
          yield self._chunk(index, {"content": self.choices.echo}, 0)
      while not stream.finished:
        output = await stream.get()
        observe(output)
        if output.finished:
          num_generated += len(output.token_ids)
        if (output := coalescer.push(output)) is not None:
          yield self._delta_chunks(output)
      if self.parsed.include_usage:
        yield sse_event(
          {**self._envelope([], "chat.completion.chunk"), "usage": self.usage(num_generated)}
        )
    except EngineDeadError as err:  # the engine died, or the drain timeout ended the stream
      yield stream_error(err).sse_event()
    yield DONE_EVENT
