"""OpenAI chat messages -> the {role, content} dicts chat templates read.

Text content parts are joined into one string; an assistant's `tool_calls` keep their
function's name and get their `arguments` parsed from JSON text into objects (as vLLM hands them
to templates); a `tool` message must name the call it answers (`tool_call_id`) and may name the
function. Every check raises ValueError("messages[i]...: message") naming the field, which the
handlers turn into a 400.
"""

from __future__ import annotations

import json

from jaxserve.server.encodable import check_encodable


def parse_messages(value: object) -> tuple[dict, ...]:
  """Chat messages as {role, content: str} (text content parts joined), plus an assistant's
  tool_calls and a tool message's tool_call_id (required, as OpenAI's API has it) and name."""
  if not isinstance(value, list) or not value:
    raise ValueError("messages: must be a non-empty list of {role, content} objects")
  messages = []
  for i, message in enumerate(value):
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
      raise ValueError(f"messages[{i}]: must be an object with a string `role`")
    parsed = {"role": message["role"], "content": _content(message.get("content"), i)}
    for key in ("tool_call_id", "name"):
      if message.get(key) is not None:
        if not isinstance(message[key], str):
          raise ValueError(f"messages[{i}].{key}: must be a string")
        parsed[key] = message[key]
    if message.get("tool_calls") is not None:
      parsed["tool_calls"] = _tool_calls(message["tool_calls"], f"messages[{i}].tool_calls")
    if parsed["role"] == "tool" and "tool_call_id" not in parsed:
      raise ValueError(f"messages[{i}].tool_call_id: a tool message must name the call it answers")
    messages.append(parsed)
  return tuple(messages)


def _tool_calls(value: object, name: str) -> list[dict]:
  """An assistant message's tool calls, arguments as objects (what chat templates expect)."""
  if not isinstance(value, list):
    raise ValueError(f"{name}: must be a list of tool calls")
  calls = []
  for j, call in enumerate(value):
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
      raise ValueError(f"{name}[{j}].function: must be an object with a string `name`")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
      try:
        arguments = json.loads(arguments or "{}")
      except json.JSONDecodeError as err:
        raise ValueError(f"{name}[{j}].function.arguments: not valid JSON: {err}") from err
    if not isinstance(arguments, dict):
      raise ValueError(f"{name}[{j}].function.arguments: must be a JSON object")
    check_encodable(arguments, f"{name}[{j}].function.arguments")
    calls.append(
      {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
      }
    )
  return calls


def _content(value: object, index: int) -> str:
  if value is None:
    return ""
  if isinstance(value, str):
    return value
  if isinstance(value, list) and all(
    isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    for p in value
  ):
    return "".join(p["text"] for p in value)
  raise ValueError(f"messages[{index}].content: must be a string or a list of text parts")
