"""Tool-call parsers, by the names of vLLM's --tool-call-parser option (llama3_json, hermes,
pythonic), and the reader of calls forced by tool_choice (forced.py, not an option)."""

from __future__ import annotations

import types
from collections.abc import Mapping

from jaxserve.structured.tool_parsers.base import (
  ParsedToolOutput,
  ParseSnapshot,
  PartialToolCall,
  StreamDelta,
  ToolCallDelta,
  ToolCallStream,
  ToolParser,
)
from jaxserve.structured.tool_parsers.forced import ForcedToolParser
from jaxserve.structured.tool_parsers.hermes import HermesToolParser
from jaxserve.structured.tool_parsers.llama3_json import Llama3JsonToolParser
from jaxserve.structured.tool_parsers.pythonic import PythonicToolParser

TOOL_PARSERS: Mapping[str, type[ToolParser]] = types.MappingProxyType(
  {
    Llama3JsonToolParser.name: Llama3JsonToolParser,
    HermesToolParser.name: HermesToolParser,
    PythonicToolParser.name: PythonicToolParser,
  }
)


def tool_parser_names() -> tuple[str, ...]:
  return tuple(sorted(TOOL_PARSERS))


def get_tool_parser(name: str) -> ToolParser:
  """The parser registered as `name`; ValueError naming tool_call_parser otherwise."""
  if name not in TOOL_PARSERS:
    raise ValueError(
      f"tool_call_parser: unknown parser {name!r}; choose one of {', '.join(tool_parser_names())}"
    )
  return TOOL_PARSERS[name]()


__all__ = [
  "ForcedToolParser",
  "HermesToolParser",
  "Llama3JsonToolParser",
  "ParseSnapshot",
  "ParsedToolOutput",
  "PartialToolCall",
  "PythonicToolParser",
  "StreamDelta",
  "TOOL_PARSERS",
  "ToolCallDelta",
  "ToolCallStream",
  "ToolParser",
  "get_tool_parser",
  "tool_parser_names",
]
