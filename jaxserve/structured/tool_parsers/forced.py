"""The calls written under a forced `tool_choice` (structured/tools.py): `{"name":"f","arguments":
{...}}` for a named function, `[call,call,...]` for "required", compact JSON, name first.

Not a --tool-call-parser: the server picks it for tool_choice "required" / a named function. It
streams like the chat-format parsers (a call's header once its name is complete, then its
argument text as written). Its final verdict differs in one way: the output is never content.
When the grammar did not finish (max_tokens, a stop string, a grammar error), the calls are what
was written, each whose name is complete with its arguments as far as written, and the snapshot
says `complete=False`, so the choice keeps its finish_reason ("length") instead of "tool_calls".
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


class ForcedToolParser(ToolParser):
  """`array`: the output is the "required" array (else one named call)."""

  name = "forced"

  def __init__(self, array: bool) -> None:
    self._array = array

  def analyze(self, text: str, final: bool) -> ParseSnapshot:
    i = skip_whitespace(text, 0)
    if not self._array:
      calls, complete, end = self._call(text, i)
      return ParseSnapshot("", calls, complete and skip_whitespace(text, end) == len(text))
    if not text.startswith("[", i):
      return ParseSnapshot("", (), False)
    calls: tuple[PartialToolCall, ...] = ()
    i = skip_whitespace(text, i + 1)
    while True:
      call, complete, end = self._call(text, i)
      calls += call
      if not complete:
        return ParseSnapshot("", calls, False)
      i = skip_whitespace(text, end)
      if text.startswith("]", i):
        return ParseSnapshot("", calls, skip_whitespace(text, i + 1) == len(text))
      if not text.startswith(",", i):
        return ParseSnapshot("", calls, False)
      i = skip_whitespace(text, i + 1)

  @staticmethod
  def _call(text: str, i: int) -> tuple[tuple[PartialToolCall, ...], bool, int]:
    """The call whose "{" is text[i] (none if its name is not complete yet), whether it is
    complete and valid, and the index after it."""
    if i >= len(text):
      return (), False, i
    scan = scan_call(text, i)
    call = partial_call(text, scan) if scan.valid else None
    complete = is_valid_call(call, scan)
    return ((call,) if call is not None else ()), complete, scan.end or len(text)
