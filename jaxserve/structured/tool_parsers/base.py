"""The tool-parser interface and the streaming machinery every parser shares.

A parser reads a model's raw output in its chat format and says, for the text so far, what is
content and what is tool calls (`analyze`, a `ParseSnapshot`). `final=False` is the streaming
view: only what the text already decides (content that cannot turn out to start a call, names
once complete, argument text as far as written); `final=True` is the whole output's verdict.

`extract` (batch) is the final snapshot with ids. `ToolCallStream` (one per choice) re-analyzes
the accumulated text at each delta and emits only what grew: new content, a call's header
(index, id, type, name and arguments "", as OpenAI streams it) once its name is complete, then
its argument fragments as they are written. Every snapshot's content and arguments are prefixes
of the next one's, so the concatenated deltas equal the batch result. (If the final verdict
rejects what looked like calls, e.g. malformed JSON, the stream sends the text as content at the
end; headers already sent cannot be taken back.) Re-analysis makes a stream O(n^2) in the output
length; tool calls are short.

A `StreamDelta` may hold a call's header and its first fragment; `StreamDelta.parts` splits it
into deltas that hold at most one entry per call, one SSE chunk each.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable
from dataclasses import dataclass

from jaxserve.structured.tool_parsers.json_scan import CallScan
from jaxserve.structured.tools import ToolCall, new_tool_call_id


@dataclass(frozen=True)
class PartialToolCall:
  name: str | None  # None until the name string is complete
  arguments: str  # the raw JSON text of the arguments, as far as written


@dataclass(frozen=True)
class ParseSnapshot:
  """`complete`: the calls are whole (only the forced parser returns a final snapshot with
  calls that are not: truncated calls; the chat-format parsers make such output content)."""

  content: str
  calls: tuple[PartialToolCall, ...] = ()
  complete: bool = True


@dataclass(frozen=True)
class ParsedToolOutput:
  """Batch result: `content` ("" if none), the calls and whether they are whole."""

  content: str
  tool_calls: tuple[ToolCall, ...]
  complete: bool = True


@dataclass(frozen=True)
class ToolCallDelta:
  """One `delta.tool_calls[]` entry: id and name on a call's first delta only."""

  index: int
  id: str | None
  name: str | None
  arguments: str

  def to_openai(self) -> dict[str, object]:
    delta: dict[str, object] = {"index": self.index}
    function: dict[str, str] = {"arguments": self.arguments}
    if self.id is not None:
      delta.update(id=self.id, type="function")
    if self.name is not None:
      function["name"] = self.name
    delta["function"] = function
    return delta


@dataclass(frozen=True)
class StreamDelta:
  content: str
  tool_calls: tuple[ToolCallDelta, ...] = ()

  def parts(self) -> tuple[StreamDelta, ...]:
    """This delta as deltas holding at most one entry per call index, in order (the content in
    the first): what one SSE chunk each carries."""
    parts: list[StreamDelta] = [StreamDelta(self.content)]
    for call in self.tool_calls:
      last = parts[-1]
      if any(sent.index == call.index for sent in last.tool_calls):
        parts.append(StreamDelta("", (call,)))
      else:
        parts[-1] = StreamDelta(last.content, (*last.tool_calls, call))
    return tuple(parts)


def partial_call(text: str, scan: CallScan) -> PartialToolCall | None:
  """The call `scan` describes, once its name is known; the arguments stream only if they are an
  object (a primitive cannot be cut safely), and are "{}" when a complete call has none."""
  if scan.name is None:
    return None
  if scan.arguments_start is None:
    return PartialToolCall(scan.name, "{}" if scan.complete else "")
  if scan.arguments_end is not None:
    return PartialToolCall(scan.name, text[scan.arguments_start : scan.arguments_end])
  streamable = text[scan.arguments_start] == "{"
  return PartialToolCall(scan.name, text[scan.arguments_start :] if streamable else "")


def is_valid_call(call: PartialToolCall | None, scan: CallScan) -> bool:
  """A complete call with a name and an object of arguments (the final verdict on one call)."""
  if call is None or not scan.complete:
    return False
  try:
    return isinstance(json.loads(call.arguments), dict)
  except json.JSONDecodeError:
    return False


class ToolParser(abc.ABC):
  """One chat format's tool-call syntax."""

  name: str = ""

  @abc.abstractmethod
  def analyze(self, text: str, final: bool) -> ParseSnapshot:
    """Content and calls of `text` (see the module docstring)."""

  def extract(
    self, text: str, id_factory: Callable[[], str] = new_tool_call_id
  ) -> ParsedToolOutput:
    snapshot = self.analyze(text, final=True)
    calls = tuple(
      ToolCall(id_factory(), call.name or "", call.arguments) for call in snapshot.calls
    )
    return ParsedToolOutput(snapshot.content, calls, snapshot.complete)

  def stream(self, id_factory: Callable[[], str] = new_tool_call_id) -> ToolCallStream:
    return ToolCallStream(self, id_factory)


class ToolCallStream:
  """Incremental parsing of one choice's output into content and `delta.tool_calls`."""

  def __init__(self, parser: ToolParser, id_factory: Callable[[], str] = new_tool_call_id) -> None:
    self._parser = parser
    self._id_factory = id_factory
    self._text = ""
    self._content = ""
    self._ids: list[str] = []
    self._names: list[str] = []
    self._arguments: list[str] = []
    self._complete = True

  def feed(self, text: str) -> StreamDelta:
    self._text += text
    return self._advance(self._parser.analyze(self._text, final=False))

  def finish(self) -> StreamDelta:
    """The last delta, once the output is complete."""
    snapshot = self._parser.analyze(self._text, final=True)
    self._complete = snapshot.complete
    return self._advance(snapshot)

  @property
  def complete(self) -> bool:
    """After finish: whether the final verdict found the calls whole."""
    return self._complete

  @property
  def tool_calls(self) -> tuple[ToolCall, ...]:
    """The calls sent so far, with their ids (after finish: all of them)."""
    return tuple(
      ToolCall(*call) for call in zip(self._ids, self._names, self._arguments, strict=True)
    )

  def _advance(self, snapshot: ParseSnapshot) -> StreamDelta:
    content = _growth(self._content, snapshot.content)
    self._content += content
    deltas: list[ToolCallDelta] = []
    for index, call in enumerate(snapshot.calls):
      if call.name is None:
        break
      deltas += self._call_deltas(index, call)
    return StreamDelta(content, tuple(deltas))

  def _call_deltas(self, index: int, call: PartialToolCall) -> list[ToolCallDelta]:
    """A new call's header, then what its arguments grew by."""
    deltas = []
    if index == len(self._ids):
      self._ids.append(self._id_factory())
      self._names.append(call.name or "")
      self._arguments.append("")
      deltas.append(ToolCallDelta(index, self._ids[index], self._names[index], ""))
    fragment = _growth(self._arguments[index], call.arguments)
    if fragment:
      self._arguments[index] += fragment
      deltas.append(ToolCallDelta(index, None, None, fragment))
    return deltas


def _growth(sent: str, now: str) -> str:
  """What `now` adds to `sent` ("" unless `sent` is a prefix of it)."""
  return now[len(sent) :] if now.startswith(sent) else ""
