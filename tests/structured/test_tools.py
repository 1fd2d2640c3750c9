"""Tool definitions, tool_choice, and the forced-call constraint driven by a random model."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from jaxserve.structured import GrammarState, SequenceMatcher, StructuredOutputError
from jaxserve.structured.tool_parsers import ForcedToolParser
from jaxserve.structured.tools import (
  MAX_PARALLEL_TOOL_CALLS,
  ToolCall,
  ToolChoice,
  ToolChoiceMode,
  parse_tool_choice,
  parse_tools,
  tool_choice_constraint,
)
from tests.structured.helpers import allowed_ids, byte_tokenizer, llama3_bpe, random_walk

WEATHER = {
  "type": "function",
  "function": {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
      "type": "object",
      "additionalProperties": False,
      "required": ["city", "unit"],
      "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
      },
    },
  },
}
SEARCH = {
  "type": "function",
  "function": {
    "name": "search",
    "parameters": {
      "type": "object",
      "additionalProperties": False,
      "required": ["query"],
      "properties": {
        "query": {"type": "string", "maxLength": 12},
        "filters": {"type": "array", "maxItems": 2, "items": {"enum": ["news", "images", "video"]}},
      },
    },
  },
}
NO_PARAMS = {"type": "function", "function": {"name": "now"}}
TOOLS = [WEATHER, SEARCH, NO_PARAMS]
CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")


def test_parse_tools_and_choice():
  tools = parse_tools(TOOLS)
  assert [t.name for t in tools] == ["get_weather", "search", "now"]
  assert tools[0].parameters() == WEATHER["function"]["parameters"]
  assert tools[2].parameters() == {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
  }
  assert parse_tool_choice(None, tools).mode is ToolChoiceMode.AUTO
  assert parse_tool_choice(None, ()).mode is ToolChoiceMode.NONE
  assert parse_tool_choice("required", tools).mode is ToolChoiceMode.REQUIRED
  named = parse_tool_choice({"type": "function", "function": {"name": "search"}}, tools)
  assert named == ToolChoice(ToolChoiceMode.NAMED, "search")
  assert tools[0].to_openai() == WEATHER
  assert tool_choice_constraint(tools, parse_tool_choice("auto", tools)) is None
  assert tool_choice_constraint(tools, parse_tool_choice("none", tools)) is None


@pytest.mark.parametrize(
  "tools, param",
  [
    ("x", "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "bad name"}}], "tools[0].function.name"),
    (
      [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
      "tools[0].function.parameters",
    ),
    ([NO_PARAMS, NO_PARAMS], "tools[1].function.name"),
  ],
)
def test_bad_tools_name_the_field(tools, param):
  with pytest.raises(StructuredOutputError) as err:
    parse_tools(tools)
  assert err.value.param == param


@pytest.mark.parametrize(
  "choice, tools, param",
  [
    ("sometimes", TOOLS, "tool_choice"),
    ("required", [], "tool_choice"),
    ({"type": "function", "function": {"name": "missing"}}, TOOLS, "tool_choice.function.name"),
    ({"type": "other"}, TOOLS, "tool_choice.type"),
  ],
)
def test_bad_tool_choice_names_the_field(choice, tools, param):
  with pytest.raises(StructuredOutputError) as err:
    parse_tool_choice(choice, parse_tools(tools))
  assert err.value.param == param


def _read_forced(text: str, choice: ToolChoice) -> tuple[ToolCall, ...]:
  """The calls of a finished forced output (asserting it holds whole calls)."""
  parsed = ForcedToolParser(array=choice.mode is ToolChoiceMode.REQUIRED).extract(text)
  assert parsed.complete and parsed.content == "", text
  return parsed.tool_calls


def _forced_calls(setup, choice_value, seed, num=10, parallel=True):
  tools = parse_tools(TOOLS)
  choice = parse_tool_choice(choice_value, tools)
  spec = tool_choice_constraint(tools, choice, parallel_tool_calls=parallel)
  setup.compiler.validate(spec)
  rng = np.random.default_rng(seed)
  results = []
  for _ in range(num):
    walk = random_walk(setup, spec, rng)
    assert walk.ended_with_eos and walk.state is GrammarState.FINISHED
    results.append(_read_forced(setup.tokenizer.decode(walk.token_ids), choice))
  return results


def _check_calls(calls: tuple[ToolCall, ...]) -> None:
  schemas = {
    t["function"]["name"]: t["function"].get("parameters", {"maxProperties": 0}) for t in TOOLS
  }
  for call in calls:
    assert CALL_ID.match(call.id)
    jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    assert call.to_openai()["function"] == {"name": call.name, "arguments": call.arguments}


@pytest.mark.parametrize("setup", [llama3_bpe, byte_tokenizer], ids=["llama3_bpe", "byte"])
def test_named_function_constraint_yields_valid_calls(setup):
  for calls in _forced_calls(setup(), {"type": "function", "function": {"name": "get_weather"}}, 0):
    assert len(calls) == 1 and calls[0].name == "get_weather"
    _check_calls(calls)


@pytest.mark.parametrize("setup", [llama3_bpe, byte_tokenizer], ids=["llama3_bpe", "byte"])
def test_required_constraint_yields_valid_calls(setup):
  all_calls = _forced_calls(setup(), "required", 1, num=16)
  for calls in all_calls:
    assert len(calls) >= 1
    _check_calls(calls)
  assert len({c.name for calls in all_calls for c in calls}) >= 2  # anyOf reaches several tools
  assert len({c.id for calls in all_calls for c in calls}) == sum(map(len, all_calls))


def test_required_without_parallel_calls_is_one_call():
  for calls in _forced_calls(llama3_bpe(), "required", 2, parallel=False):
    assert len(calls) == 1
    _check_calls(calls)


@pytest.mark.parametrize("parallel", [True, False])
def test_required_array_closes_at_its_bound(parallel):
  """After the most calls allowed, the grammar lets the model write only `]` (then EOS): greedy
  decoding that would go on writing calls cannot run to the end of the context."""
  setup = byte_tokenizer()
  tools = parse_tools(TOOLS)
  choice = parse_tool_choice("required", tools)
  spec = tool_choice_constraint(tools, choice, parallel_tool_calls=parallel)
  matcher = SequenceMatcher(setup.compiler.compile(spec), setup.info)
  call = '{"name":"now","arguments":{}}'  # compact, the name first
  bound = MAX_PARALLEL_TOOL_CALLS if parallel else 1
  assert matcher.consume(list(("[" + ",".join([call] * bound)).encode()))
  bitmask = setup.filler.new_bitmask(1)
  matcher.fill_bitmask(bitmask, 0)
  assert allowed_ids(bitmask[0], 512).tolist() == [ord("]")]
  assert matcher.consume([ord("]")]) and matcher.state is GrammarState.FINISHED
  assert len(_read_forced("[" + ",".join([call] * bound) + "]", choice)) == bound


@pytest.mark.parametrize(
  "choice_value", ["required", {"type": "function", "function": {"name": "search"}}]
)
def test_forced_calls_write_the_name_before_the_arguments(choice_value):
  """The grammar fixes `{"name":"` first, so a stream can send a call's name, then its arguments
  as they are written (a JSON schema would order the keys as its properties: sorted)."""
  setup = byte_tokenizer()
  tools = parse_tools(TOOLS)
  spec = tool_choice_constraint(tools, parse_tool_choice(choice_value, tools))
  matcher = SequenceMatcher(setup.compiler.compile(spec), setup.info)
  bitmask = setup.filler.new_bitmask(1)
  for char in ("[" if choice_value == "required" else "") + '{"name":"':
    matcher.fill_bitmask(bitmask, 0)
    assert allowed_ids(bitmask[0], 512).tolist() == [ord(char)]
    assert matcher.consume([ord(char)])


def test_forced_call_arguments_may_use_refs_of_their_own_schema():
  """Each tool's parameters are the root of their schema in the grammar: `#/$defs/...` resolves."""
  unit = {"$defs": {"unit": {"enum": ["C", "F"]}}, "type": "object"}
  tool = {
    "type": "function",
    "function": {
      "name": "t",
      "parameters": {**unit, "required": ["u"], "properties": {"u": {"$ref": "#/$defs/unit"}}},
    },
  }
  tools = parse_tools([tool])
  choice = parse_tool_choice({"type": "function", "function": {"name": "t"}}, tools)
  walk = random_walk(
    byte_tokenizer(), tool_choice_constraint(tools, choice), np.random.default_rng(0)
  )
  calls = _read_forced(byte_tokenizer().tokenizer.decode(walk.token_ids), choice)
  assert json.loads(calls[0].arguments)["u"] in ("C", "F")
