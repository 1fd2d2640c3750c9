"""Reasoning parsers, by the names of vLLM's --reasoning-parser option: they split a chat
reply's reasoning from its content (server.reasoning_parser; server/chat_choices.py applies
them). Plain text processing: imports nothing of jaxserve."""

from __future__ import annotations

import types
from collections.abc import Mapping

from jaxserve.reasoning.think_tags import (
  ReasoningDelta,
  ReasoningSplit,
  ThinkTagParser,
  ThinkTagStream,
)

REASONING_PARSERS: Mapping[str, ThinkTagParser] = types.MappingProxyType(
  {
    "deepseek_r1": ThinkTagParser("deepseek_r1", explicit_start=False),
    "qwen3": ThinkTagParser("qwen3", explicit_start=True),
  }
)


def reasoning_parser_names() -> tuple[str, ...]:
  return tuple(sorted(REASONING_PARSERS))


def get_reasoning_parser(name: str) -> ThinkTagParser:
  """The parser registered as `name`; ValueError naming reasoning_parser otherwise."""
  if name not in REASONING_PARSERS:
    raise ValueError(
      f"reasoning_parser: unknown parser {name!r}; choose one of "
      f"{', '.join(reasoning_parser_names())}"
    )
  return REASONING_PARSERS[name]


__all__ = [
  "REASONING_PARSERS",
  "ReasoningDelta",
  "ReasoningSplit",
  "ThinkTagParser",
  "ThinkTagStream",
  "get_reasoning_parser",
  "reasoning_parser_names",
]
