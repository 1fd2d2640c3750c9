"""Tool calls in chat responses: the front end's half of tool calling (the engine only enforces
the constraint of tool_choice "required" / a named function).

Per request, `ToolCallFormatter` decides how a choice's text becomes an OpenAI message:
* tool_choice "required" or a named function: the text is the constrained call(s)
  (structured/tools.py), parsed whole; streamed, the calls are sent as one `delta.tool_calls`
  once the choice ends (the text is JSON the client never sees);
* "auto" with a --tool-call-parser (server.tool_call_parser): the parser of the model's chat
  format splits content from calls, streamed incrementally (structured/tool_parsers);
* otherwise ("none", no tools, or no parser configured): the text is the content.
A choice that produced calls ends with finish_reason "tool_calls" (unless max_tokens cut it:
"length", and whatever was written is content).
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxserve.outputs import FinishReason
from jaxserve.server.protocol import ChatRequest
from jaxserve.structured.tool_parsers import (
  StreamDelta,
  ToolCallDelta,
  ToolCallStream,
  ToolParser,
  get_tool_parser,
)
from jaxserve.structured.tools import ToolCall, ToolChoiceMode, parse_forced_tool_calls

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
    self._choice = parsed.tool_choice
    self._forced = parsed.forced_tool_calls
    self._parser: ToolParser | None = None
    if (
      not self._forced
      and parsed.tools
      and parser_name is not None
      and self._choice.mode is ToolChoiceMode.AUTO
    ):
      self._parser = get_tool_parser(parser_name)

  @property
  def active(self) -> bool:
    return self._forced or self._parser is not None

  def final(self, text: str, finish_reason: str | None) -> ChoiceMessage:
    if self._forced:
      if finish_reason == "stop":
        try:
          return ChoiceMessage(
            None, parse_forced_tool_calls(text, self._choice), TOOL_CALLS_FINISH_REASON
          )
        except ValueError:
          pass
      return ChoiceMessage(text, (), finish_reason)
    if self._parser is None:
      return ChoiceMessage(text, (), finish_reason)
    parsed = self._parser.extract(text)
    if not parsed.tool_calls:
      return ChoiceMessage(text, (), finish_reason)
    return ChoiceMessage(parsed.content or None, parsed.tool_calls, _with_calls(finish_reason))

  def stream(self) -> "ChoiceStream":
    return ChoiceStream(self, self._parser.stream() if self._parser is not None else None)


class ChoiceStream:
  """One streamed choice: text deltas in, content and tool-call deltas out."""

  def __init__(self, formatter: ToolCallFormatter, parser_stream: ToolCallStream | None) -> None:
    self._formatter = formatter
    self._stream = parser_stream
    self._text = ""
    self._sent_calls = False

  def feed(self, text: str) -> StreamDelta:
    self._text += text
    if self._stream is None:
      return StreamDelta("")  # forced calls: sent whole at the end
    delta = self._stream.feed(text)
    self._sent_calls |= bool(delta.tool_calls)
    return delta

  def finish(self, finish_reason: str | None) -> tuple[StreamDelta, str | None]:
    """The last delta and the choice's finish_reason."""
    if self._stream is not None:
      delta = self._stream.finish()
      self._sent_calls |= bool(delta.tool_calls)
      return delta, _with_calls(finish_reason) if self._sent_calls else finish_reason
    message = self._formatter.final(self._text, finish_reason)
    if not message.tool_calls:
      return StreamDelta(message.content or ""), message.finish_reason
    deltas = tuple(
      ToolCallDelta(i, call.id, call.name, call.arguments)
      for i, call in enumerate(message.tool_calls)
    )
    return StreamDelta("", deltas), message.finish_reason


def _with_calls(finish_reason: str | None) -> str | None:
  return TOOL_CALLS_FINISH_REASON if finish_reason == "stop" else finish_reason
