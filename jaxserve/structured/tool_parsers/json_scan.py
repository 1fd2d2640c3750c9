"""A scanner for one tool-call object `{"name": ..., "arguments": {...}}` that may be incomplete.

Streaming needs to know, of a call the model is still writing, whether its name is complete and
where its arguments value starts (and ends, once it does), without waiting for the whole object.
`scan_call(text, start)` reads the object opening at text[start] as far as the text goes. The
arguments are reported as the raw text of their value (whitespace and key order as written), so
the streamed argument fragments are prefixes of the final string by construction. The key of the
arguments is "arguments" or "parameters" (Llama 3's word).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ARGUMENT_KEYS = ("arguments", "parameters")
_WHITESPACE = " \t\n\r"
_PRIMITIVE_CHARS = frozenset("-+.0123456789eEtrufalsn")


@dataclass(frozen=True)
class CallScan:
  """What text[start:] tells of one call object so far."""

  valid: bool  # False: text[start:] cannot be a call object
  name: str | None = None  # the name, once its string is complete
  arguments_start: int | None = None
  arguments_end: int | None = None  # None while the arguments value is incomplete
  end: int | None = None  # index after the closing brace; None while incomplete

  @property
  def complete(self) -> bool:
    return self.valid and self.end is not None


class _Invalid(Exception):
  pass


@dataclass
class _Found:
  """What the scan has read so far (mutable, local to one scan)."""

  num_keys: int = 0
  name: str | None = None
  arguments_start: int | None = None
  arguments_end: int | None = None

  def result(self, end: int | None = None) -> CallScan:
    return CallScan(True, self.name, self.arguments_start, self.arguments_end, end)


def skip_whitespace(text: str, i: int) -> int:
  while i < len(text) and text[i] in _WHITESPACE:
    i += 1
  return i


def _string_end(text: str, i: int) -> int | None:
  """text[i] is '"': the index after its closing quote, None if the text ends first."""
  i += 1
  while i < len(text):
    if text[i] == "\\":
      i += 2
      continue
    if text[i] == '"':
      return i + 1
    i += 1
  return None


def _container_end(text: str, i: int) -> int | None:
  closers = {"{": "}", "[": "]"}
  stack = [closers[text[i]]]
  i += 1
  while i < len(text):
    char = text[i]
    if char == '"':
      end = _string_end(text, i)
      if end is None:
        return None
      i = end
      continue
    if char in closers:
      stack.append(closers[char])
    elif char in "}]":
      if stack.pop() != char:
        raise _Invalid
      if not stack:
        return i + 1
    i += 1
  return None


def value_end(text: str, i: int) -> int | None:
  """The index after the JSON value starting at text[i]; None if the text may still continue it."""
  char = text[i]
  if char == '"':
    return _string_end(text, i)
  if char in "{[":
    return _container_end(text, i)
  if char not in _PRIMITIVE_CHARS:
    raise _Invalid
  j = i
  while j < len(text) and text[j] in _PRIMITIVE_CHARS:
    j += 1
  return None if j == len(text) else j


def scan_call(text: str, start: int) -> CallScan:
  """Scans the call object whose "{" is text[start]."""
  try:
    return _scan(text, start)
  except (_Invalid, ValueError):  # ValueError: a key or name string with a bad escape
    return CallScan(valid=False)


def _scan(text: str, start: int) -> CallScan:
  if text[start] != "{":
    raise _Invalid
  found = _Found()
  i = start + 1
  while True:
    i = skip_whitespace(text, i)
    if i < len(text) and text[i] == "}" and not found.num_keys:
      return found.result(end=i + 1)
    if i >= len(text):
      return found.result()
    if text[i] != '"':
      raise _Invalid
    key_end = _string_end(text, i)
    if key_end is None:
      return found.result()
    key = json.loads(text[i:key_end])
    found.num_keys += 1
    i = skip_whitespace(text, key_end)
    if i >= len(text):
      return found.result()
    if text[i] != ":":
      raise _Invalid
    i = skip_whitespace(text, i + 1)
    if i >= len(text):
      return found.result()
    end = value_end(text, i)
    _record(found, key, text, i, end)
    if end is None:
      return found.result()
    i = skip_whitespace(text, end)
    if i >= len(text):
      return found.result()
    if text[i] == "}":
      return found.result(end=i + 1)
    if text[i] != ",":
      raise _Invalid
    i += 1


def _record(found: _Found, key: str, text: str, start: int, end: int | None) -> None:
  if key == "name" and end is not None:
    name = json.loads(text[start:end])
    if not isinstance(name, str):
      raise _Invalid
    found.name = name
  elif key in ARGUMENT_KEYS:
    if found.arguments_start is not None:
      raise _Invalid
    found.arguments_start = start
    found.arguments_end = end
