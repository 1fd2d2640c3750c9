"""Tool-call parsers on hand-written outputs: batch results, and streamed deltas that reassemble
to them under any split of the text (each call opening with a header whose arguments are "");
the forced-call reader's truncated calls."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from jaxserve.structured.tool_parsers import (
  ForcedToolParser,
  StreamDelta,
  ToolCallDelta,
  get_tool_parser,
  tool_parser_names,
)

HERMES_TWO_CALLS = (
  "I'll look both up.\n"
  '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2], '
  '"note": "a } and a \\" and </tool_call>"}}\n</tool_call>\n'
  '<tool_call>\n{"arguments": {}, "name": "now"}\n</tool_call>'
)
PYTHONIC_TWO_CALLS = (
  '[get_weather(city=\'Paris\', days=[1, -2, 3.5], note="a ) and a \\" and ]\\u00e9", '
  'opts={"deep": (None, True)}),\n now()]'
)
LLAMA3_TWO_CALLS = (
  '<|python_tag|>{"name": "search", "parameters": {"query": "jax; xla", '
  '"filters": {"k": [1, {"d": 2}]}}}; {"name": "now", "parameters": {}}'
)


def _ids():
  counter = itertools.count()
  return lambda: f"call_{next(counter):024x}"


def _parser(name: str):
  return {"forced": ForcedToolParser(array=True)}.get(name) or get_tool_parser(name)


def _stream(parser_name: str, chunks: list[str]) -> list[StreamDelta]:
  stream = _parser(parser_name).stream(_ids())
  return [stream.feed(chunk) for chunk in chunks] + [stream.finish()]


def _reassemble(deltas: list[StreamDelta]) -> tuple[str, list[dict[str, str]]]:
  content = "".join(d.content for d in deltas)
  calls: dict[int, dict[str, str]] = {}
  for delta in deltas:
    for call in delta.tool_calls:
      entry = call.to_openai()
      if call.index not in calls:
        assert entry["id"] and entry["type"] == "function" and "name" in entry["function"]
        assert entry["function"]["arguments"] == ""  # the header alone, as OpenAI streams it
        calls[call.index] = {"id": entry["id"], "name": entry["function"]["name"], "arguments": ""}
      else:
        assert "id" not in entry and "name" not in entry["function"]
      calls[call.index]["arguments"] += entry["function"]["arguments"]
  return content, [calls[i] for i in sorted(calls)]


def _splits(text: str, seed: int) -> list[list[str]]:
  rng = np.random.default_rng(seed)
  random_cuts = sorted(
    rng.choice(np.arange(1, len(text)), size=min(12, len(text) - 1), replace=False)
  )
  random_chunks = [
    text[a:b] for a, b in zip([0, *random_cuts], [*random_cuts, len(text)], strict=True)
  ]
  return [[text], list(text), random_chunks]


def _batch(parser_name: str, text: str) -> tuple[str, list[dict[str, str]]]:
  out = _parser(parser_name).extract(text, _ids())
  return out.content, [
    {"id": c.id, "name": c.name, "arguments": c.arguments} for c in out.tool_calls
  ]


def test_registry():
  assert tool_parser_names() == ("hermes", "llama3_json", "pythonic")
  with pytest.raises(ValueError, match="tool_call_parser"):
    get_tool_parser("mistral")


def test_hermes_batch():
  content, calls = _batch("hermes", HERMES_TWO_CALLS)
  assert content == "I'll look both up.\n"
  assert [c["name"] for c in calls] == ["get_weather", "now"]
  assert json.loads(calls[0]["arguments"]) == {
    "city": "Paris",
    "days": [1, 2],
    "note": 'a } and a " and </tool_call>',
  }
  assert calls[1]["arguments"] == "{}"


def test_llama3_batch():
  content, calls = _batch("llama3_json", LLAMA3_TWO_CALLS)
  assert content == ""
  assert [c["name"] for c in calls] == ["search", "now"]
  assert json.loads(calls[0]["arguments"]) == {"query": "jax; xla", "filters": {"k": [1, {"d": 2}]}}
  _, plain = _batch("llama3_json", '  {"name": "f", "arguments": {"x": 1}}')
  assert plain[0]["name"] == "f" and json.loads(plain[0]["arguments"]) == {"x": 1}


@pytest.mark.parametrize(
  "parser_name, text",
  [
    ("hermes", HERMES_TWO_CALLS),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": "b"}}'),  # no closing tag (eos)
    ("hermes", "Just text, with a < sign and <tool_ but no call."),
    ("hermes", 'Broken: <tool_call>\n{"name": "f", "arguments": {"a": </tool_call>'),
    ("llama3_json", LLAMA3_TWO_CALLS),
    ("llama3_json", '\n{"name": "f", "parameters": {"x": [1, 2]}}'),
    ("llama3_json", "The answer is 42. {not a call}"),
    ("llama3_json", "<|python"),
    ("llama3_json", '{"name": "f", "parameters": {"x": 1}} trailing words'),
    ("llama3_json", '{"name": "f", "parameters": {"x": 1'),  # cut off by max_tokens
    ("pythonic", PYTHONIC_TWO_CALLS),
    ("pythonic", ' [f(a="x\\ny", b=\'c\' "d",)]\n'),
    ("pythonic", "I would call [f(a=1)]"),
    ("pythonic", '[f(a="b")] and then text'),
    ("pythonic", '[f(a="b"), g(1)]'),
    ("pythonic", '[f(a="b", c=3'),  # cut off by max_tokens
    ("forced", '[{"name":"f","arguments":{"a":"x}]"}},{"name":"g","arguments":{}}]'),
  ],
)
def test_streamed_deltas_reassemble_to_the_batch_result(parser_name, text):
  expected = _batch(parser_name, text)
  for seed, chunks in enumerate(_splits(text, seed=len(text))):
    deltas = _stream(parser_name, chunks)
    if expected[1]:
      assert _reassemble(deltas) == expected, (seed, chunks)
    else:  # no calls: all of it is content
      assert _reassemble(deltas)[0] == expected[0] == text


@pytest.mark.parametrize("text", ["Broken: <tool_call>\n{oops}", '{"name": 3, "parameters": {}}'])
def test_malformed_calls_are_content(text):
  parser = "hermes" if "tool_call" in text else "llama3_json"
  content, calls = _batch(parser, text)
  assert (content, calls) == (text, [])


def test_stream_holds_back_a_possible_tag_and_sends_header_before_arguments():
  stream = get_tool_parser("hermes").stream(_ids())
  assert stream.feed("Hi <tool").content == "Hi "
  assert stream.feed('_call>\n{"name": "get_').tool_calls == ()
  header = stream.feed('weather", "arguments": {"ci')
  assert header.tool_calls[0].name == "get_weather" and header.tool_calls[0].id
  assert header.tool_calls[0].arguments == "" and header.tool_calls[1].arguments == '{"ci'
  fragment = stream.feed('ty": "Oslo"}}\n</tool_call>')
  assert fragment.tool_calls[0].arguments == 'ty": "Oslo"}' and fragment.tool_calls[0].id is None
  assert stream.finish() == StreamDelta("")
  assert [(c.name, c.arguments) for c in stream.tool_calls] == [("get_weather", '{"city": "Oslo"}')]


def test_llama3_content_streams_at_once():
  stream = get_tool_parser("llama3_json").stream()
  assert stream.feed("  ").content == ""  # could still become a call
  assert stream.feed("Sure").content == "  Sure"  # it is content from here on
  assert stream.feed(" thing.").content == " thing."


def test_pythonic_batch():
  content, calls = _batch("pythonic", PYTHONIC_TWO_CALLS)
  assert content == "" and [c["name"] for c in calls] == ["get_weather", "now"]
  assert json.loads(calls[0]["arguments"]) == {
    "city": "Paris",
    "days": [1, -2, 3.5],
    "note": 'a ) and a " and ]\u00e9',
    "opts": {"deep": [None, True]},
  }
  assert calls[0]["arguments"].startswith('{"city": "Paris", "days": [1, -2, 3.5]')  # vLLM's text
  assert calls[1]["arguments"] == "{}"


@pytest.mark.parametrize(
  "text",
  [
    "[f(1)]",  # positional
    "[f(a=x)]",  # a variable
    "[f(a=1, a=2)]",
    "[f(**k)]",
    "[f(a={1: 2})]",  # a key JSON cannot hold
    "[f(a=1e999)]",  # not finite
    "[obj.f(a=1)]",
    "[]",
    "[f(a=1)] trailing",
    "Plain text.",
  ],
)
def test_pythonic_non_calls_are_content(text):
  assert _batch("pythonic", text) == (text, [])


def test_pythonic_streams_string_arguments_as_written():
  stream = get_tool_parser("pythonic").stream(_ids())
  assert stream.feed(" ") == StreamDelta("")  # could still be a call
  assert stream.feed("[get_wea") == StreamDelta("")
  header = stream.feed("ther(ci")
  assert header.tool_calls == (
    ToolCallDelta(0, "call_000000000000000000000000", "get_weather", ""),
    ToolCallDelta(0, None, None, "{"),
  )
  assert [len(part.tool_calls) for part in header.parts()] == [1, 1]  # one chunk each
  assert stream.feed('ty="Pa').tool_calls == (ToolCallDelta(0, None, None, '"city": "Pa'),)
  assert stream.feed("ri\\u00").tool_calls == (ToolCallDelta(0, None, None, "ri"),)  # held
  assert stream.feed('e9s", days=').tool_calls == (ToolCallDelta(0, None, None, 'és"'),)
  assert stream.feed("3)]").tool_calls == (ToolCallDelta(0, None, None, ', "days": 3}'),)
  assert stream.finish() == StreamDelta("") and stream.complete


def test_forced_calls_cut_off_are_truncated_calls_not_content():
  parser = ForcedToolParser(array=True)
  cut = parser.extract('[{"name":"f","arguments":{"a":1}},{"name":"g","arguments":{"b":"x', _ids())
  assert (cut.content, cut.complete) == ("", False)
  assert [(c.name, c.arguments) for c in cut.tool_calls] == [("f", '{"a":1}'), ("g", '{"b":"x')]
  assert parser.extract('[{"name":"f', _ids()) == type(cut)("", (), False)
  named = ForcedToolParser(array=False).extract('{"name":"f","arguments":{"a":[1', _ids())
  assert [(c.name, c.arguments, named.complete) for c in named.tool_calls] == [
    ("f", '{"a":[1', False)
  ]
  whole = ForcedToolParser(array=False).extract('{"name":"f","arguments":{}}', _ids())
  assert whole.complete and whole.tool_calls[0].arguments == "{}"
