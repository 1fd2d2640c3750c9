"""Llama 3.x JSON tool calls: the output is `{"name": ..., "parameters": {...}}`, several joined by
";", optionally after `<|python_tag|>` (the tag is only visible with skip_special_tokens off).

An output that starts (after whitespace) with neither "{" nor the tag is content. A call output
that does not parse in full (malformed, cut off, text after the calls) is returned as content, as
vLLM does.
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

PYTHON_TAG = "<|python_tag|>"
CALL_SEPARATOR = ";"


class Llama3JsonToolParser(ToolParser):
  name = "llama3_json"

  def analyze(self, text: str, final: bool) -> ParseSnapshot:
    start = skip_whitespace(text, 0)
    head = text[start:]
    if head.startswith(PYTHON_TAG):
      return self._calls(text, skip_whitespace(text, start + len(PYTHON_TAG)), final)
    if head.startswith("{"):
      return self._calls(text, start, final)
    undecided = not head or PYTHON_TAG.startswith(head)
    return ParseSnapshot("" if undecided and not final else text)

  def _calls(self, text: str, i: int, final: bool) -> ParseSnapshot:
    calls: list[PartialToolCall] = []
    valid = True
    while i < len(text):
      scan = scan_call(text, i)
      call = partial_call(text, scan) if scan.valid else None
      if call is not None:
        calls.append(call)
      if not is_valid_call(call, scan):
        valid = False
        break
      i = skip_whitespace(text, scan.end)
      if i < len(text) and text[i] != CALL_SEPARATOR:
        valid = False
        break
      i = skip_whitespace(text, i + 1)
    if not final:
      return ParseSnapshot("", tuple(calls))
    return ParseSnapshot("", tuple(calls)) if valid and calls else ParseSnapshot(text)
