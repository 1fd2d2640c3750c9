"""POST /v1/chat/completions: the chat template, streaming or not, with logprobs.

The prompt is rendered with the tokenizer's chat template and encoded without adding special
tokens (the template writes bos). Without max_tokens / max_completion_tokens a reply may use
the rest of the context: max_model_len - prompt tokens.

Streaming opens each choice with a role chunk, then sends a chunk per engine step that produced
the choice's tokens, `delta.content` empty while the detokenizer holds text back
(server/stream_interval.py); the last carries the finish_reason.

Tool calling: `tools` go to the chat template; server/tool_calls.py turns a choice's text into
`tool_calls` (message or `delta.tool_calls`) with finish_reason "tool_calls".
"""

from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from jaxserve.core.streams import EngineDeadError, OutputStream
from jaxserve.outputs import RequestOutput
from jaxserve.sampling_params import SamplingParams
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
from jaxserve.server.tool_calls import ChoiceStream, ToolCallFormatter
from jaxserve.structured.tool_parsers import StreamDelta

# Engine and template errors name "prompt" / "chat_template"; the request's field is messages.
_RENAME = {"prompt": "messages", "chat_template": "messages"}


async def create_chat_completion(request: Request) -> Response:
  state: ServingState = request.app.state.serving
  body = await read_json(request)
  state.check_model(body)
  try:
    parsed = parse_chat_request(body, state.max_model_len, state.config.max_logprobs)
    state.check_n(parsed.params.n)
  except ValueError as err:
    raise bad_request(err) from err
  state.check_serving()
  try:
    prompt_ids = await state.run_blocking(_encode_chat, state, parsed)
    params = _final_params(parsed, len(prompt_ids), state.max_model_len)
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    specs = expand_requests(response_id, [prompt_ids], params)
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
  tokenizer = state.tokenizer
  text = tokenizer.apply_chat_template(list(parsed.messages), parsed.add_generation_prompt, tools)
  budget = PromptBudget(state.max_model_len, parsed.max_tokens)
  return encode_prompt(tokenizer, text, budget, add_special_tokens=False)


def _final_params(
  parsed: ChatRequest, num_prompt_tokens: int, max_model_len: int
) -> SamplingParams:
  """Without max_tokens, the reply may take the rest of the context (_encode_chat left it at
  least one token)."""
  if parsed.max_tokens is not None:
    return parsed.params
  return parsed.params.replace(max_tokens=max_model_len - num_prompt_tokens)


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
    self.tools = ToolCallFormatter(parsed, state.config.tool_call_parser)
    self._streams: dict[int, ChoiceStream] = {}

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
      message = self.tools.final(out.text, out.finish_reason)
      choices.append(
        {
          "index": self.index[rid],
          "message": message.to_openai(),
          "logprobs": self._logprobs(out.logprobs),
          "finish_reason": message.finish_reason,
        }
      )
    body = self._envelope(choices, "chat.completion")
    body["usage"] = self.usage(sum(len(out.token_ids) for _, out in ordered))
    return body

  def _chunk(
    self, index: int, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None
  ) -> str:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return sse_event(self._envelope([choice], "chat.completion.chunk"))

  def _delta_chunk(self, output: RequestOutput) -> str:
    """One output's tokens: their text (empty while held back) and logprobs, and the
    finish_reason when it is the last (an aborted choice's last may have no tokens: {})."""
    index = self.index[output.request_id]
    logprobs = self._logprobs(output.new_logprobs) if output.new_token_ids else None
    if self.tools.active:
      return self._tool_chunks(index, output, logprobs)
    delta = {"content": output.new_text} if output.new_token_ids else {}
    return self._chunk(index, delta, output.finish_reason, logprobs)

  def _tool_chunks(self, index: int, output: RequestOutput, logprobs: dict | None) -> str:
    """The chunk of a choice whose text may hold tool calls; its last step gets a second chunk
    with what the parser's final verdict adds and the finish_reason."""
    stream = self._streams.setdefault(index, self.tools.stream())
    chunks = self._chunk(index, _delta(stream.feed(output.new_text)), None, logprobs)
    if output.finished:
      last, finish_reason = stream.finish(output.finish_reason)
      chunks += self._chunk(index, _delta(last), finish_reason)
    return chunks

  async def events(self, stream: OutputStream) -> AsyncIterator[str]:
    observe = self.state.metrics.observer(stream.engine_index)
    coalescer = StepCoalescer(self.state.config.stream_interval)
    num_generated = 0
    try:
      for index in range(len(self.index)):
        yield self._chunk(index, {"role": "assistant", "content": ""})
      while not stream.finished:
        output = await stream.get()
        observe(output)
        if output.finished:
          num_generated += len(output.token_ids)
        if (output := coalescer.push(output)) is not None:
          yield self._delta_chunk(output)
      if self.parsed.include_usage:
        yield sse_event(
          {**self._envelope([], "chat.completion.chunk"), "usage": self.usage(num_generated)}
        )
    except EngineDeadError as err:  # the engine died, or the drain timeout ended the stream
      yield stream_error(err).sse_event()
    yield DONE_EVENT


def _delta(delta: StreamDelta) -> dict:
  out: dict = {"content": delta.content} if delta.content else {}
  if delta.tool_calls:
    out["tool_calls"] = [call.to_openai() for call in delta.tool_calls]
  return out
