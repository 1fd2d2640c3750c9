"""Pythonic tool calls (vLLM's `pythonic` parser; Llama 3.2 and 4, ToolACE): the output is a
Python list of calls with keyword arguments, `[get_weather(city="Paris", days=3), now()]`.

Final verdict (batch, and a stream's end): Python's `ast` parses the output (leading and trailing
whitespace aside) as one expression, which must be a non-empty list of calls of plain names with
keyword arguments only, each value a literal (`ast.literal_eval`: strings, numbers, True, False,
None, lists, tuples, dicts; negative numbers too) of JSON's types (string keys, finite numbers).
A call's arguments are `json.dumps(kwargs, ensure_ascii=False)`, in the order written, as vLLM
writes them. Anything else (text before or after the list, a positional argument, a variable as
a value) makes the whole output content, as in vLLM.

Streaming: an output that starts (after whitespace) with "[" is read as calls, any other output
is content at once (leading whitespace is held while undecided). A scanner finds the boundaries
of calls and keyword arguments without evaluating code: a call's header goes out once its name
and "(" are written; its arguments grow by `"key": value` as each value is complete (the "," or
")" after it), and a plain string value streams as it is written (decoded; an escape still being
written is held back). What is sent is always a prefix of the final JSON text.
"""

from __future__ import annotations

import ast
import json
import math
import re

from jaxserve.structured.tool_parsers.base import ParseSnapshot, PartialToolCall, ToolParser

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WHITESPACE = " \t\n\r"
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
# an escape at the end of a partial string that more characters could still change
_OPEN_ESCAPE = re.compile(
  r"(?<!\\)(?:\\\\)*(\\(?:[0-7]{1,2}|x[0-9a-fA-F]?|u[0-9a-fA-F]{0,3}|U[0-9a-fA-F]{0,7}|N(?:\{[^}]*)?)?)$"
)
_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]


class _Invalid(Exception):
  pass


def _skip(text: str, i: int) -> int:
  while i < len(text) and text[i] in _WHITESPACE:
    i += 1
  return i


def _json_value(value: object) -> JsonValue:
  """`value` (from literal_eval) as JSON's types; _Invalid for anything JSON cannot hold."""
  if value is None or isinstance(value, (bool, int, str)):
    return value
  if isinstance(value, float) and math.isfinite(value):
    return value
  if isinstance(value, (list, tuple)):
    return [_json_value(item) for item in value]
  if isinstance(value, dict) and all(isinstance(key, str) for key in value):
    return {key: _json_value(item) for key, item in value.items()}
  raise _Invalid


def _literal(node_or_text: ast.expr | str) -> JsonValue:
  try:
    return _json_value(ast.literal_eval(node_or_text))
  except _LITERAL_ERRORS as e:
    raise _Invalid from e


def _string_end(text: str, i: int) -> int | None:
  """text[i] is a quote: the index after the string literal, None while it may continue."""
  quote = text[i]
  if text.startswith(quote * 3, i):
    close, j = quote * 3, i + 3
  elif text[i + 1 :] in ("", quote):  # `"` or `""` at the end: maybe a triple quote's start
    return None
  else:
    close, j = quote, i + 1
  while j < len(text):
    if text[j] == "\\":
      j += 2
    elif text.startswith(close, j):
      return j + len(close)
    elif text[j] == "\n" and len(close) == 1:
      raise _Invalid
    else:
      j += 1
  return None


def _value_end(text: str, i: int) -> int | None:
  """The end of the argument value from text[i]: the "," or ")" after it at depth 0, None while
  the text may still continue it."""
  stack: list[str] = []
  j = i
  while j < len(text):
    char = text[j]
    if char in "'\"":
      end = _string_end(text, j)
      if end is None:
        return None
      j = end
      continue
    if char in _CLOSERS:
      stack.append(_CLOSERS[char])
    elif char in ")]}":
      if not stack and char == ")":
        return j
      if not stack or stack.pop() != char:
        raise _Invalid
    elif char == "," and not stack:
      return j
    elif char == "#":
      raise _Invalid
    j += 1
  return None


def _partial_string(text: str, i: int) -> str | None:
  """The JSON text so far, without its closing quote, of a plain string literal opened at
  text[i] that is all the value holds yet (more may follow: an implicit concatenation)."""
  quote, body = text[i], text[i + 1 :]
  if quote not in "'\"" or body.startswith(quote):
    return None
  end = _string_end(text, i)
  if end is None:
    body = body[: len(body) - len(m.group(1))] if (m := _OPEN_ESCAPE.search(body)) else body
  elif text[end:].strip():
    return None
  else:
    body = text[i + 1 : end - 1]
  try:
    value = _literal(quote + body + quote)
  except _Invalid:
    return None
  return json.dumps(value, ensure_ascii=False)[:-1] if isinstance(value, str) else None


def _item(key: str, value_json: str) -> str:
  return f"{json.dumps(key, ensure_ascii=False)}: {value_json}"


def _scan_call(text: str, i: int) -> tuple[PartialToolCall | None, int | None]:
  """The call starting at text[i] as far as written (None before its "("), and the index after
  its ")" (None while it is incomplete)."""
  name = _IDENTIFIER.match(text, i)
  if name is None:
    raise _Invalid
  if name.end() == len(text):
    return None, None
  j = _skip(text, name.end())
  if j == len(text):
    return None, None
  if text[j] != "(":
    raise _Invalid
  items: list[str] = []
  keys: set[str] = set()
  j = _skip(text, j + 1)
  while j < len(text) and text[j] != ")":
    key = _IDENTIFIER.match(text, j)
    if key is None:
      raise _Invalid
    k = _skip(text, key.end())
    if k == len(text):
      return PartialToolCall(name.group(), "{" + ", ".join(items)), None
    if text[k] != "=" or key.group() in keys:
      raise _Invalid
    keys.add(key.group())
    v = _skip(text, k + 1)
    end = _value_end(text, v) if v < len(text) else None
    if end is None:
      partial = _partial_string(text, v) if v < len(text) else None
      if partial is not None:
        items.append(_item(key.group(), partial))
      return PartialToolCall(name.group(), "{" + ", ".join(items)), None
    items.append(_item(key.group(), json.dumps(_literal(text[v:end].strip()), ensure_ascii=False)))
    j = _skip(text, end + 1) if text[end] == "," else end
  arguments = "{" + ", ".join(items)
  if j == len(text):
    return PartialToolCall(name.group(), arguments), None
  return PartialToolCall(name.group(), arguments + "}"), j + 1


class PythonicToolParser(ToolParser):
  name = "pythonic"

  def analyze(self, text: str, final: bool) -> ParseSnapshot:
    start = _skip(text, 0)
    if start == len(text):
      return ParseSnapshot(text if final else "")
    if text[start] != "[":
      return ParseSnapshot(text)
    if final:
      calls = self._final_calls(text)
      return ParseSnapshot("", calls) if calls else ParseSnapshot(text)
    return ParseSnapshot("", self._partial_calls(text, start + 1))

  @staticmethod
  def _final_calls(text: str) -> tuple[PartialToolCall, ...]:
    """The calls of a whole output, by `ast`; () if it is not a list of calls."""
    try:
      tree = ast.parse(text.strip(), mode="eval")
    except _LITERAL_ERRORS:
      return ()
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
      return ()
    calls = []
    for node in tree.body.elts:
      if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return ()
      names = [keyword.arg for keyword in node.keywords]
      if None in names or len(set(names)) < len(names):
        return ()  # **kwargs, or a keyword repeated (a compile error, which ast.parse lets by)
      try:
        arguments = {keyword.arg: _literal(keyword.value) for keyword in node.keywords}
      except _Invalid:
        return ()
      calls.append(PartialToolCall(node.func.id, json.dumps(arguments, ensure_ascii=False)))
    return tuple(calls)

  @staticmethod
  def _partial_calls(text: str, i: int) -> tuple[PartialToolCall, ...]:
    """The calls written so far, the last maybe incomplete (streaming; stops where the text
    stops being a list of calls: the final verdict decides what it is)."""
    calls: list[PartialToolCall] = []
    try:
      while (i := _skip(text, i)) < len(text) and text[i] != "]":
        call, end = _scan_call(text, i)
        if call is not None:
          calls.append(call)
        if end is None:
          break
        i = _skip(text, end)
        if i < len(text) and text[i] != ",":
          break
        i += 1
    except _Invalid:
      pass
    return tuple(calls)
