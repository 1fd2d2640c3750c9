"""Tool calling that completes on the built-in model (tiny-random, byte tokenizer), with the
official openai client against a real uvicorn server on 127.0.0.1 (the shared `served` fixture):
greedy decoding on random weights, the worst case for a constraint that does not bound itself.

* tool_choice "required" with parallel_tool_calls false, and a named function, end with
  finish_reason "tool_calls" and exactly one call that validates against its tool's schema, well
  inside the context (the grammar closes the array; its bound of MAX_PARALLEL_TOOL_CALLS with
  parallel calls is checked on the grammar in tests/structured/test_tools.py, since eight calls
  of bytes do not fit this server's 256-token context);
* streamed, a forced call opens with a header (id, type, name, arguments "") and its arguments
  follow in fragments as the model writes them (the byte tokenizer: several chunks), which
  concatenate to JSON that validates;
* a forced call cut by max_tokens comes back as a truncated call (tool_calls, content null,
  finish_reason "length"), whole and streamed alike;
* --tool-call-parser pythonic (a second API server on the same engine core): a structured-output
  regex makes the random model write a pythonic call, read back as tool_calls, whole and streamed;
* the round trip call -> `tool` message -> answer goes through the built-in chat template, streamed
  and not.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.server.server_helpers import start_server

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
  "type": "function",
  "function": {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
      "type": "object",
      "additionalProperties": False,
      "required": ["city", "unit"],
      "properties": {
        "city": {"type": "string", "maxLength": 4},
        "unit": {"enum": ["C", "F"]},
      },
    },
  },
}
TIME = {
  "type": "function",
  "function": {
    "name": "get_time",
    "parameters": {
      "type": "object",
      "additionalProperties": False,
      "required": ["zone"],
      "properties": {"zone": {"enum": ["UTC", "CET"]}},
    },
  },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def client(served):
  with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0) as c:
    c.model_name = served.server.state.model_name
    yield c


@pytest.fixture(scope="module")
def pythonic_client(served):
  """An API server reading "auto" tool calls with the pythonic parser, on the shared core."""
  server = start_server(served.backend, tool_call_parser="pythonic")
  with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
    c.model_name = served.server.state.model_name
    yield c
  server.stop()


def _calls(client, stream: bool, **kwargs) -> tuple[list[dict], str, int | None]:
  """The assistant's tool calls (OpenAI message dicts), finish reason and completion tokens."""
  kwargs = dict(
    model=client.model_name,
    messages=MESSAGES,
    tools=TOOLS,
    temperature=0,  # no max_tokens: a call that did not close would run to the end of the context
    **kwargs,
  )
  if not stream:
    completion = client.chat.completions.create(**kwargs)
    choice = completion.choices[0]
    assert choice.message.content is None
    calls = [call.model_dump() for call in choice.message.tool_calls or ()]
    return calls, choice.finish_reason, completion.usage.completion_tokens
  calls: dict[int, dict] = {}
  finish_reason = None
  for chunk in client.chat.completions.create(**kwargs, stream=True):
    for choice in chunk.choices:
      assert not choice.delta.content
      for delta in choice.delta.tool_calls or ():
        call = calls.setdefault(
          delta.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        call["id"] = delta.id or call["id"]
        call["function"]["name"] += delta.function.name or ""
        call["function"]["arguments"] += delta.function.arguments or ""
      finish_reason = choice.finish_reason or finish_reason
  return [calls[i] for i in sorted(calls)], finish_reason, None


def _check(calls: list[dict]) -> None:
  assert calls and all(call["id"].startswith("call_") for call in calls)
  for call in calls:
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, SCHEMAS[call["function"]["name"]])


CHOICES = {
  "required-single": dict(tool_choice="required", parallel_tool_calls=False),
  "named": dict(tool_choice={"type": "function", "function": {"name": "get_time"}}),
}


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_forced_calls_close_under_greedy_decoding(client, choice):
  calls, finish_reason, completion_tokens = _calls(client, False, **CHOICES[choice])
  assert finish_reason == "tool_calls"
  assert completion_tokens < 150  # of the ~190 the 256-token context leaves
  _check(calls)
  assert len(calls) == 1
  if choice == "named":
    assert [call["function"]["name"] for call in calls] == ["get_time"]


def _stream_entries(client, **kwargs) -> tuple[list[list[dict]], str | None, str]:
  """Each chunk's `delta.tool_calls` entries (as dicts), the finish reason and the content."""
  chunks, finish_reason, content = [], None, ""
  for chunk in client.chat.completions.create(model=client.model_name, stream=True, **kwargs):
    for choice in chunk.choices:
      content += choice.delta.content or ""
      chunks.append([entry.model_dump() for entry in choice.delta.tool_calls or ()])
      finish_reason = choice.finish_reason or finish_reason
  return chunks, finish_reason, content


def _check_streamed_call(chunks: list[list[dict]]) -> tuple[dict, int]:
  """The one call of a stream, and how many chunks carried its arguments."""
  entries = [entry for chunk in chunks for entry in chunk]
  assert all(len(chunk) <= 1 for chunk in chunks) and {e["index"] for e in entries} == {0}
  header, fragments = entries[0], entries[1:]
  assert header["id"].startswith("call_") and header["type"] == "function"
  assert header["function"]["name"] in SCHEMAS and header["function"]["arguments"] == ""
  assert all(e["id"] is None and e["function"]["name"] is None for e in fragments)
  arguments = "".join(e["function"]["arguments"] for e in fragments)
  return {"name": header["function"]["name"], "arguments": arguments}, len(fragments)


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_streamed_forced_call_arguments_arrive_as_written(client, choice):
  chunks, finish_reason, content = _stream_entries(
    client, messages=MESSAGES, tools=TOOLS, temperature=0, **CHOICES[choice]
  )
  assert finish_reason == "tool_calls" and content == ""
  call, num_fragments = _check_streamed_call(chunks)
  assert num_fragments >= 5  # byte tokens: the arguments come a few bytes per chunk
  jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
  whole, _, _ = _calls(client, False, **CHOICES[choice])  # greedy: the same call
  assert [(c["function"]["name"], c["function"]["arguments"]) for c in whole] == [
    (call["name"], call["arguments"])
  ]


def test_forced_call_cut_by_max_tokens_is_a_truncated_call(client):
  """40 byte tokens hold `[{"name":"get_weather","arguments":{` and a few bytes more."""
  kwargs = dict(
    messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=40, **CHOICES["required-single"]
  )
  choice = client.chat.completions.create(model=client.model_name, **kwargs).choices[0]
  assert (choice.finish_reason, choice.message.content) == ("length", None)
  [call] = choice.message.tool_calls
  assert call.function.name in SCHEMAS and call.function.arguments.startswith("{")
  with pytest.raises(json.JSONDecodeError):
    json.loads(call.function.arguments)  # cut off: what was written, as written
  chunks, finish_reason, content = _stream_entries(client, **kwargs)
  assert (finish_reason, content) == ("length", "")
  streamed, _ = _check_streamed_call(chunks)
  assert streamed == {"name": call.function.name, "arguments": call.function.arguments}


PYTHONIC_REGEX = r'\[get_weather\(city="(Oslo|Lima)", unit="[CF]"\)\]'


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_pythonic_tool_call_parser(pythonic_client, stream):
  kwargs = dict(
    messages=MESSAGES,
    tools=TOOLS,
    temperature=0,
    max_tokens=64,
    extra_body={"structured_outputs": {"regex": PYTHONIC_REGEX}},
  )
  if not stream:
    choice = pythonic_client.chat.completions.create(
      model=pythonic_client.model_name, **kwargs
    ).choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    [entry] = choice.message.tool_calls
    call = {"name": entry.function.name, "arguments": entry.function.arguments}
  else:
    chunks, finish_reason, content = _stream_entries(pythonic_client, **kwargs)
    assert (finish_reason, content) == ("tool_calls", "")
    call, num_fragments = _check_streamed_call(chunks)
    assert num_fragments >= 3  # "{", then the city as written, then the unit
  assert call["name"] == "get_weather"
  arguments = json.loads(call["arguments"])
  jsonschema.validate(arguments, SCHEMAS["get_weather"])
  assert call["arguments"] == json.dumps(arguments)  # vLLM's text: ", " and ": "


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_round_trip_on_the_builtin_model(client, stream):
  """call -> `tool` result message (through the built-in chat template) -> an answer."""
  calls, finish_reason, _ = _calls(
    client, stream, tool_choice="required", parallel_tool_calls=False
  )
  assert finish_reason == "tool_calls"
  _check(calls)
  messages = [
    *MESSAGES,
    {"role": "assistant", "content": None, "tool_calls": calls},
    *({"role": "tool", "tool_call_id": call["id"], "content": "12 degrees"} for call in calls),
  ]
  kwargs = dict(model=client.model_name, messages=messages, tools=TOOLS, max_tokens=8)
  if not stream:
    answer = client.chat.completions.create(**kwargs, temperature=0).choices[0]
    assert answer.message.tool_calls is None and isinstance(answer.message.content, str)
    finish_reason = answer.finish_reason
  else:
    finish_reason, text = None, ""
    for chunk in client.chat.completions.create(**kwargs, temperature=0, stream=True):
      for choice in chunk.choices:
        assert not choice.delta.tool_calls
        text += choice.delta.content or ""
        finish_reason = choice.finish_reason or finish_reason
  assert finish_reason in ("stop", "length")


def test_unknown_role_is_still_a_400(client):
  with pytest.raises(openai.BadRequestError, match="unsupported role"):
    client.chat.completions.create(
      model=client.model_name, messages=[{"role": "critic", "content": "x"}], max_tokens=1
    )
