"""OpenAI tool calling: typed tool definitions, `tool_choice`, the constraint that forces a call.

`tools` is a list of `{"type": "function", "function": {"name", "description", "parameters",
"strict"}}`; `tool_choice` is "none", "auto", "required" or `{"type": "function", "function":
{"name": ...}}` (default: "auto" with tools, "none" without).

"required" and a named function are enforced by a grammar (`tool_choice_constraint`, Lark with
each tool's parameters inlined as a JSON schema), so they work on any model, a random one
included; the model then writes the calls directly (no chat-format markers), compact JSON with
the name first so that a stream can send a call's name before its arguments:
* named function f: one object `{"name":"f","arguments":<f's parameters>}`;
* required: an array `[call,call,...]` of such objects, each of one of the tools (vLLM's shape,
  with "arguments" rather than "parameters"): at most `MAX_PARALLEL_TOOL_CALLS` elements,
  exactly one when parallel_tool_calls is false.
tool_parsers/forced.py reads that output back, whole or streamed.

Bounds. The number of calls is bounded in the grammar, so the array always closes: a model that
would go on writing calls (greedy decoding on random weights does) is made to end the array, then
the output, and the choice finishes with "tool_calls". The arguments are bounded only as far as
the tool's schema bounds them (maxLength, maxItems, enums): llguidance caps tokens only on a
lexeme (a terminal's `max_tokens`), not on a JSON value, and capping what the schema leaves open
(a string's length) would change what the tool accepts. So max_tokens can still cut a call: the
choice then ends with finish_reason "length" and `tool_calls` holding what was written (each call
whose name is complete, its arguments the JSON text as far as written), never as `content`.
"auto" is left to the model and the tool-call parser of its chat format
(jaxserve/structured/tool_parsers).
"""

from __future__ import annotations

import enum
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jaxserve.structured.grammar import json_options
from jaxserve.structured.spec import (
  JsonValue,
  StructuredOutputError,
  StructuredOutputSpec,
  WhitespacePolicy,
)

TOOLS = "tools"
TOOL_CHOICE = "tool_choice"
MAX_PARALLEL_TOOL_CALLS = 8
CALL_NAME_KEY = "name"
CALL_ARGUMENTS_KEY = "arguments"
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# OpenAI: "omitting parameters defines a function with an empty parameter list"
_EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def new_tool_call_id() -> str:
  """An OpenAI-style tool call id: "call_" and 24 random hex digits."""
  return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolFunction:
  """One function tool; `parameters_json` is its parameters schema as canonical JSON text."""

  name: str
  description: str | None = None
  parameters_json: str = json.dumps(_EMPTY_PARAMETERS, sort_keys=True, separators=(",", ":"))
  strict: bool | None = None

  def parameters(self) -> dict[str, JsonValue]:
    return json.loads(self.parameters_json)

  def to_openai(self) -> dict[str, JsonValue]:
    """The tool as OpenAI writes it (what chat templates receive as `tools`)."""
    function: dict[str, JsonValue] = {"name": self.name, "parameters": self.parameters()}
    if self.description is not None:
      function["description"] = self.description
    return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
  """A parsed call; `arguments` is JSON text (an object), as OpenAI returns it."""

  id: str
  name: str
  arguments: str

  def to_openai(self) -> dict[str, object]:
    return {
      "id": self.id,
      "type": "function",
      "function": {"name": self.name, "arguments": self.arguments},
    }


class ToolChoiceMode(str, enum.Enum):
  NONE = "none"
  AUTO = "auto"
  REQUIRED = "required"
  NAMED = "named"


@dataclass(frozen=True)
class ToolChoice:
  mode: ToolChoiceMode
  function_name: str | None = None  # set for NAMED only


def parse_tools(value: object, param: str = TOOLS) -> tuple[ToolFunction, ...]:
  """The request's `tools` (None or missing: no tools)."""
  if value is None:
    return ()
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
    raise StructuredOutputError(param, f"must be a list of tools, got {type(value).__name__}")
  tools = tuple(_parse_tool(tool, f"{param}[{i}]") for i, tool in enumerate(value))
  names = [tool.name for tool in tools]
  for i, name in enumerate(names):
    if name in names[:i]:
      raise StructuredOutputError(
        f"{param}[{i}].function.name", f"duplicate function name {name!r}"
      )
  return tools


def _parse_tool(tool: object, param: str) -> ToolFunction:
  if not isinstance(tool, Mapping) or tool.get("type") != "function":
    raise StructuredOutputError(f"{param}.type", "only tools of type 'function' are supported")
  function = tool.get("function")
  if not isinstance(function, Mapping):
    raise StructuredOutputError(f"{param}.function", "must be an object")
  name = function.get("name")
  if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
    raise StructuredOutputError(
      f"{param}.function.name", f"must match {_FUNCTION_NAME.pattern}, got {name!r}"
    )
  description = function.get("description")
  if description is not None and not isinstance(description, str):
    raise StructuredOutputError(f"{param}.function.description", "must be a string")
  strict = function.get("strict")
  if strict is not None and not isinstance(strict, bool):
    raise StructuredOutputError(f"{param}.function.strict", "must be a boolean")
  parameters = function.get("parameters")
  parameters = _EMPTY_PARAMETERS if parameters is None else parameters
  spec = StructuredOutputSpec.json_schema(parameters, param=f"{param}.function.parameters")
  return ToolFunction(name, description, spec.source, strict)


def parse_tool_choice(
  value: object, tools: Sequence[ToolFunction], param: str = TOOL_CHOICE
) -> ToolChoice:
  """The request's `tool_choice`, checked against `tools`."""
  if value is None:
    return ToolChoice(ToolChoiceMode.AUTO if tools else ToolChoiceMode.NONE)
  if isinstance(value, str):
    if value not in ("none", "auto", "required"):
      raise StructuredOutputError(
        param, f"must be 'none', 'auto', 'required' or a function, got {value!r}"
      )
    if value != "none" and not tools:
      raise StructuredOutputError(param, f"{value!r} needs a non-empty tools list")
    return ToolChoice(ToolChoiceMode(value))
  if not isinstance(value, Mapping) or value.get("type") != "function":
    raise StructuredOutputError(f"{param}.type", "must be 'function'")
  function = value.get("function")
  name = function.get("name") if isinstance(function, Mapping) else None
  if name not in {tool.name for tool in tools}:
    raise StructuredOutputError(f"{param}.function.name", f"{name!r} is not one of the tools")
  return ToolChoice(ToolChoiceMode.NAMED, name)


def _lark_string(text: str) -> str:
  return json.dumps(text)  # a JSON string literal is a valid Lark string literal


def _call_rules(index: int, tool: ToolFunction) -> list[str]:
  """Rules `call_<index>` (the whole call object) and `args_<index>` (its parameters)."""
  name, arguments = json.dumps(CALL_NAME_KEY), json.dumps(CALL_ARGUMENTS_KEY)
  head = "{" + f"{name}:{json.dumps(tool.name)},{arguments}:"
  schema = {**tool.parameters(), "x-guidance": json_options(WhitespacePolicy.COMPACT)}
  return [
    f'call_{index}: {_lark_string(head)} args_{index} "}}"',
    f"args_{index}: %json {json.dumps(schema, sort_keys=True, ensure_ascii=False)}",
  ]


def tool_call_grammar(
  tools: Sequence[ToolFunction], choice: ToolChoice, parallel_tool_calls: bool = True
) -> str | None:
  """The Lark grammar that forces the calls `choice` asks for; None for "none" and "auto"."""
  if choice.mode is ToolChoiceMode.NAMED:
    named = [t for t in tools if t.name == choice.function_name]
    if not named:
      raise StructuredOutputError(
        f"{TOOL_CHOICE}.function.name", f"{choice.function_name!r} is not one of the tools"
      )
    return "\n".join(["start: call_0", *_call_rules(0, named[0])])
  if choice.mode is not ToolChoiceMode.REQUIRED:
    return None
  more = MAX_PARALLEL_TOOL_CALLS - 1 if parallel_tool_calls else 0
  rules = [
    f'start: "[" call ("," call){{0,{more}}} "]"' if more else 'start: "[" call "]"',
    "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
  ]
  for i, tool in enumerate(tools):
    rules += _call_rules(i, tool)
  return "\n".join(rules)


def tool_choice_constraint(
  tools: Sequence[ToolFunction], choice: ToolChoice, parallel_tool_calls: bool = True
) -> StructuredOutputSpec | None:
  """The constraint for `choice` (see the module docstring); None when the model is free."""
  grammar = tool_call_grammar(tools, choice, parallel_tool_calls)
  return None if grammar is None else StructuredOutputSpec.grammar(grammar, param=TOOL_CHOICE)
