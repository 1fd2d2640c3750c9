"""How a chat request's choice text becomes an OpenAI message (whole) or deltas (streamed): the
one place the reply's parts are put together.

1. With a reasoning parser (server.reasoning_parser, jaxserve/reasoning), the <think> block is
   split off first: `reasoning_content` (and vLLM's newer name `reasoning`, the same text) in
   the message or the deltas, unless the request sets include_reasoning false. A constrained
   reply (response_format, structured_outputs, a forced tool call) is not split: the grammar
   covers the whole text, which is the content.
2. What is left is the content, where tool calls are read (server/tool_calls.py).
3. Chat `echo` puts the last message's content before the reply's (ChatPrompt.echo_text); a
   stream sends it in its own chunk after the role chunk (ChatView).

Whole and streamed replies agree: the same parsers, fed the whole text or its deltas.
"""

from __future__ import annotations

from jaxserve.reasoning import ThinkTagParser, ThinkTagStream, get_reasoning_parser
from jaxserve.server.protocol import ChatRequest
from jaxserve.server.tool_calls import ChoiceStream, ToolCallFormatter
from jaxserve.structured.tool_parsers import StreamDelta

REASONING_FIELDS = ("reasoning_content", "reasoning")


class ChatChoices:
  """One chat request's choices (see the module docstring)."""

  def __init__(
    self, parsed: ChatRequest, tool_call_parser: str | None, reasoning_parser: str | None
  ) -> None:
    self.tools = ToolCallFormatter(parsed, tool_call_parser)
    self.reasoning: ThinkTagParser | None = None
    if reasoning_parser is not None and parsed.params.structured_outputs is None:
      self.reasoning = get_reasoning_parser(reasoning_parser)
    self.include_reasoning = parsed.include_reasoning
    self.echo = parsed.prompt.echo_text if parsed.echo else ""

  def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """A whole choice's message and finish_reason."""
    reasoning = None
    if self.reasoning is not None:
      split = self.reasoning.split(text)
      reasoning, text = split.reasoning, split.content or ""
    choice = self.tools.final(text, finish_reason)
    message = choice.to_openai()
    content = message["content"]
    if self.reasoning is not None and not content:
      content = None  # all of it was reasoning
    if self.echo:
      content = self.echo + (content or "")
    message["content"] = content
    self.add_reasoning(message, reasoning)
    return message, choice.finish_reason

  def deltas(self) -> ChoiceDeltas:
    return ChoiceDeltas(self)

  def add_reasoning(self, out: dict, reasoning: str | None) -> None:
    """`reasoning` into a message or delta, under both of vLLM's names, when reported."""
    if self.reasoning is not None and self.include_reasoning:
      for name in REASONING_FIELDS:
        out[name] = reasoning


class ChoiceDeltas:
  """One streamed choice: text deltas in, OpenAI `delta` objects out."""

  def __init__(self, choices: ChatChoices) -> None:
    self._choices = choices
    self._reasoning: ThinkTagStream | None = (
      choices.reasoning.stream() if choices.reasoning is not None else None
    )
    self._tools: ChoiceStream | None = choices.tools.stream() if choices.tools.active else None

  def feed(self, text: str) -> list[dict]:
    """The deltas of a step's new text, one chunk each (at least one; {} when it adds nothing
    yet)."""
    if self._reasoning is None:
      return self._deltas("", text)
    piece = self._reasoning.feed(text)
    return self._deltas(piece.reasoning, piece.content)

  def finish(self, finish_reason: str | None) -> tuple[list[dict], str | None]:
    """What the choice's end releases (held text, the tool parser's verdict), one chunk each
    ([] when nothing), and its finish_reason."""
    deltas: list[dict] = []
    if self._reasoning is not None:
      piece = self._reasoning.finish()
      deltas = self._deltas(piece.reasoning, piece.content)
    if self._tools is not None:
      last, finish_reason = self._tools.finish(finish_reason)
      deltas += [_tool_delta(delta) for delta in last]
    return [delta for delta in deltas if delta], finish_reason

  def _deltas(self, reasoning: str, content: str) -> list[dict]:
    """The reasoning and the content's deltas: the content's (or the tool parser's, one per
    chunk: a chunk holds at most one entry per call) with the reasoning in the first."""
    first: dict = {}
    if reasoning and self._choices.include_reasoning:
      self._choices.add_reasoning(first, reasoning)
    if self._tools is None:
      if content:
        first["content"] = content
      return [first]
    parts = [_tool_delta(delta) for delta in self._tools.feed(content)] or [{}]
    parts[0] = {**first, **parts[0]}
    return parts


def _tool_delta(delta: StreamDelta) -> dict:
  out: dict = {"content": delta.content} if delta.content else {}
  if delta.tool_calls:
    out["tool_calls"] = [call.to_openai() for call in delta.tool_calls]
  return out
