"""Tool calling that completes on the built-in model (tiny-random, byte tokenizer), with the
official openai client against a real uvicorn server on 127.0.0.1 (the shared `served` fixture):
greedy decoding on random weights, the worst case for a constraint that does not bound itself.

* tool_choice "required" with parallel_tool_calls false, and a named function, end with
  finish_reason "tool_calls" and exactly one call that validates against its tool's schema, well
  inside the context (the grammar closes the array; its bound of MAX_PARALLEL_TOOL_CALLS with
  parallel calls is checked on the grammar in tests/structured/test_tools.py, since eight calls
  of bytes do not fit this server's 256-token context);
* the round trip call -> `tool` message -> answer goes through the built-in chat template, streamed
  and not.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

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
