"""Tool calls in chat responses: the front end's half of tool calling (the engine only enforces
the constraint of tool_choice "required" / a named function).

Per request, `ToolCallFormatter` picks the parser that reads a choice's text:
* tool_choice "required" or a named function: the forced-call reader (tool_parsers/forced.py)
  of the constrained output (structured/tools.py);
* "auto" with a --tool-call-parser (server.tool_call_parser): the parser of the model's chat
  format, which splits content from calls;
* otherwise ("none", no tools, or no parser configured): none, the text is the content.

Whole or streamed, the result is the same. Streamed, a call's first `delta.tool_calls` entry
carries its index, id, type and name with arguments "" (as OpenAI and vLLM send it), the next
ones its argument fragments as the model writes them; `ChoiceStream.feed` returns the deltas of
one engine output, each to be sent as its own chunk (at most one entry per call in a chunk).

finish_reason: "tool_calls" when the choice produced calls and ended on its own ("stop") with
the calls whole; otherwise the engine's reason. A forced call cut by max_tokens is reported as a
truncated call (`tool_calls` with what was written, the arguments' JSON text as far as it goes,
`content` null, finish_reason "length"), never as content; structured/tools.py says why the
grammar cannot always close the call within max_tokens. With a chat-format parser, output that
does not parse as calls (cut off or malformed) is content, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxserve.api.outputs import FinishReason
from jaxserve.server.protocol import ChatRequest
from jaxserve.structured.tool_parsers import (
  ForcedToolParser,
  StreamDelta,
  ToolCallStream,
  ToolParser,
  get_tool_parser,
)
from jaxserve.structured.tools import ToolCall, ToolChoiceMode

TOOL_CALLS_FINISH_REASON = FinishReason.TOOL_CALLS


@dataclass(frozen=True)
class ChoiceMessage:
  content: str | None
  tool_calls: tuple[ToolCall, ...]
  finish_reason: str | None

  def to_openai(self) -> dict[str, object]:
    message: dict[str, object] = {"role": "assistant", "content": self.content}
    if self.tool_calls:
      message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
    return message


class ToolCallFormatter:
  """How one chat request's choices become messages and deltas (see the module docstring)."""

  def __init__(self, parsed: ChatRequest, parser_name: str | None) -> None:
    self._forced = parsed.forced_tool_calls
    self._parser: ToolParser | None = None
    if self._forced:
      self._parser = ForcedToolParser(array=parsed.tool_choice.mode is ToolChoiceMode.REQUIRED)
    elif parsed.tools and parser_name and parsed.tool_choice.mode is ToolChoiceMode.AUTO:
      self._parser = get_tool_parser(parser_name)

  @property
  def active(self) -> bool:
    return self._parser is not None

  def final(self, text: str, finish_reason: str | None) -> ChoiceMessage:
    if self._parser is None:
      return ChoiceMessage(text, (), finish_reason)
    parsed = self._parser.extract(text)
    if not parsed.tool_calls and not self._forced:
      return ChoiceMessage(text, (), finish_reason)
    reason = _finish_reason(finish_reason, bool(parsed.tool_calls), parsed.complete)
    return ChoiceMessage(parsed.content or None, parsed.tool_calls, reason)

  def stream(self) -> ChoiceStream:
    return ChoiceStream(self._parser.stream() if self._parser is not None else None)


class ChoiceStream:
  """One streamed choice: text deltas in, content and tool-call deltas out (one chunk each)."""

  def __init__(self, parser_stream: ToolCallStream | None) -> None:
    self._stream = parser_stream
    self._sent_calls = False

  def feed(self, text: str) -> tuple[StreamDelta, ...]:
    if self._stream is None:
      return (StreamDelta(text),)
    return self._parts(self._stream.feed(text))

  def finish(self, finish_reason: str | None) -> tuple[tuple[StreamDelta, ...], str | None]:
    """The last deltas and the choice's finish_reason."""
    if self._stream is None:
      return (StreamDelta(""),), finish_reason
    parts = self._parts(self._stream.finish())
    return parts, _finish_reason(finish_reason, self._sent_calls, self._stream.complete)

  def _parts(self, delta: StreamDelta) -> tuple[StreamDelta, ...]:
    self._sent_calls |= bool(delta.tool_calls)
    return delta.parts()


def _finish_reason(engine_reason: str | None, has_calls: bool, complete: bool) -> str | None:
  if has_calls and complete and engine_reason == "stop":
    return TOOL_CALLS_FINISH_REASON
  return engine_reason
