"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
(usually with newlines around the JSON), after optional content.

Content is the text before the first `<tool_call>` (streaming holds back a suffix that could
start the tag); text between and after the blocks is dropped. A missing closing tag at the end of
the output is accepted (generation stopped on eos). If any block does not parse, the whole output
is returned as content, as vLLM does.
"""

from __future__ import annotations

from jaxserve.structured.tool_parsers.base import (
  ParseSnapshot,
  PartialToolCall,
  ToolParser,
  is_valid_call,
  partial_call,
)
from jaxserve.structured.tool_parsers.json_scan import scan_call, skip_whitespace

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


def _held_suffix(text: str, tag: str) -> int:
  """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
  for length in range(min(len(tag) - 1, len(text)), 0, -1):
    if text.endswith(tag[:length]):
      return length
  return 0


class HermesToolParser(ToolParser):
  name = "hermes"

  def analyze(self, text: str, final: bool) -> ParseSnapshot:
    first = text.find(TOOL_CALL_START)
    if first < 0:
      held = 0 if final else _held_suffix(text, TOOL_CALL_START)
      return ParseSnapshot(text[: len(text) - held])
    calls, valid = self._blocks(text, first)
    if final and not (valid and calls):
      return ParseSnapshot(text)
    return ParseSnapshot(text[:first], tuple(calls))

  def _blocks(self, text: str, start: int) -> tuple[list[PartialToolCall], bool]:
    """The calls of the blocks from text[start] on, and whether all are complete and valid."""
    calls: list[PartialToolCall] = []
    while start >= 0:
      i = skip_whitespace(text, start + len(TOOL_CALL_START))
      if i >= len(text):
        return calls, False
      scan = scan_call(text, i)
      call = partial_call(text, scan) if scan.valid else None
      if call is not None:
        calls.append(call)
      if not is_valid_call(call, scan):
        return calls, False
      after = skip_whitespace(text, scan.end)
      if not text.startswith(TOOL_CALL_END, after) and not TOOL_CALL_END.startswith(text[after:]):
        return calls, False
      start = text.find(TOOL_CALL_START, after)
    return calls, True
