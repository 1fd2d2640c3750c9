"""Reasoning in <think>...</think> tags split from a chat reply's content, whole or streamed.

One state machine does both (`ThinkTagParser.split` feeds the whole text to a stream), so a
streamed reply's reasoning and content deltas join to exactly what the whole reply gives,
however the text is cut into deltas. Tags are matched in the text (a tag that is one token or
several), a partial tag at the end of a delta is held until the next one settles it.

* `qwen3` (explicit_start): reasoning only when the reply opens with the start tag (leading
  whitespace allowed, dropped with the tag), as vLLM's Qwen3 parser needs it; a reply without
  it (Qwen3 with `enable_thinking: false`, whose template writes an empty think block into the
  prompt) is all content.
* `deepseek_r1` (implicit start): the reply is reasoning from its first character, an opening tag
  there dropped, as vLLM's DeepSeek-R1 parser reads DeepSeek-R1's replies (its template opens
  the tag in the prompt).

Reasoning ends at the first end tag; what follows is content. A reply that ends inside the
reasoning (max_tokens) is all reasoning, no content (vLLM's streaming behavior; its non-streaming
Qwen3 parser would return such a reply as content, tag and all).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningDelta:
  """What one piece of reply text adds: reasoning text and content text (either may be "")."""

  reasoning: str = ""
  content: str = ""


@dataclass(frozen=True)
class ReasoningSplit:
  """A whole reply: its reasoning and its content, None where there is none."""

  reasoning: str | None
  content: str | None


class _Mode(enum.Enum):
  OPENING = "opening"  # before the reply shows whether it opens with the start tag
  REASONING = "reasoning"
  CONTENT = "content"


@dataclass(frozen=True)
class ThinkTagParser:
  """A reasoning parser of vLLM's --reasoning-parser names (module docstring)."""

  name: str
  explicit_start: bool
  start_tag: str = "<think>"
  end_tag: str = "</think>"

  def stream(self) -> ThinkTagStream:
    return ThinkTagStream(self)

  def split(self, text: str) -> ReasoningSplit:
    stream = self.stream()
    first, last = stream.feed(text), stream.finish()
    return ReasoningSplit(
      first.reasoning + last.reasoning or None, first.content + last.content or None
    )


class ThinkTagStream:
  """One reply, text deltas in, reasoning and content deltas out; finish() releases what a
  partial tag held back."""

  def __init__(self, parser: ThinkTagParser) -> None:
    self._parser = parser
    self._mode = _Mode.OPENING
    self._held = ""

  def feed(self, text: str) -> ReasoningDelta:
    held, self._held = self._held + text, ""
    if self._mode is _Mode.OPENING:
      return self._open(held)
    if self._mode is _Mode.REASONING:
      return self._reason(held)
    return ReasoningDelta(content=held)

  def finish(self) -> ReasoningDelta:
    held, self._held = self._held, ""
    if self._mode is _Mode.CONTENT or (self._mode is _Mode.OPENING and self._parser.explicit_start):
      return ReasoningDelta(content=held)
    return ReasoningDelta(reasoning=held)

  def _open(self, text: str) -> ReasoningDelta:
    start = self._parser.start_tag
    stripped = text.lstrip()
    if stripped.startswith(start):
      self._mode = _Mode.REASONING
      return self._reason(stripped[len(start) :])
    if start.startswith(stripped):  # a (possibly empty) start of the tag: wait for more
      self._held = text
      return ReasoningDelta()
    if self._parser.explicit_start:
      self._mode = _Mode.CONTENT
      return ReasoningDelta(content=text)
    self._mode = _Mode.REASONING
    return self._reason(text)

  def _reason(self, text: str) -> ReasoningDelta:
    end = self._parser.end_tag
    index = text.find(end)
    if index >= 0:
      self._mode = _Mode.CONTENT
      return ReasoningDelta(text[:index], text[index + len(end) :])
    keep = _partial_tag_length(text, end)
    self._held = text[len(text) - keep :]
    return ReasoningDelta(reasoning=text[: len(text) - keep])


def _partial_tag_length(text: str, tag: str) -> int:
  """The length of the longest suffix of `text` that is a proper prefix of `tag`."""
  for length in range(min(len(text), len(tag) - 1), 0, -1):
    if text.endswith(tag[:length]):
      return length
  return 0
