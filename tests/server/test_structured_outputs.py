"""Structured outputs and tool calling over HTTP: raw bodies (httpx) and the official openai client
(`chat.completions.parse` with a pydantic model, a tool-calling round trip), against a real uvicorn
server on 127.0.0.1 (the engine core in its own process) over a tiny random-weight Qwen2 checkpoint
with a real byte-level BPE tokenizer. Outputs are checked with jsonschema / `re`, not with the
grammar engine that produced them."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

from tests.integration.engine_helpers import small_config
from tests.integration.structured_helpers import (
  CHOICES,
  MAX_TOKENS,
  REGEX,
  SCHEMAS,
  assert_regex,
  assert_valid_json,
)
from tests.server.server_helpers import core_backend, start_core, start_server, wait_for_idle

MESSAGES = [{"role": "user", "content": "Tell me about someone."}]
WEATHER = {
  "type": "function",
  "function": {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
      "type": "object",
      "additionalProperties": False,
      "required": ["city", "unit"],
      "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "unit": {"enum": ["C", "F"]}},
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


@pytest.fixture(scope="module")
def server(hf_checkpoint):
  """The engine core in its own process (constraints cross the IPC), one API server."""
  config = small_config(
    str(hf_checkpoint("qwen2")),
    max_model_len=256,
    max_num_seqs=16,
    seq_buckets=(16,),
    token_buckets=(64,),
  )
  core = start_core(config)
  running = start_server(core_backend(core), tool_call_parser="hermes")
  yield running
  running.stop()
  assert core.stop() == 0


@pytest.fixture(scope="module")
def client(server):
  with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
    c.model_name = server.state.model_name
    yield c


def _post(server, path: str, body: dict) -> httpx.Response:
  return httpx.post(f"{server.url}/v1/{path}", json=body, timeout=120)


def _streamed_texts(server, path: str, body: dict) -> dict[int, tuple[str, str]]:
  """{choice index: (text, finish_reason)} of a streamed response."""
  texts: dict[int, list[str]] = {}
  finish: dict[int, str] = {}
  with httpx.stream(
    "POST", f"{server.url}/v1/{path}", json={**body, "stream": True}, timeout=120
  ) as response:
    assert response.status_code == 200
    for line in response.iter_lines():
      if not line.startswith("data: ") or line == "data: [DONE]":
        continue
      for choice in json.loads(line[6:])["choices"]:
        piece = choice["text"] if path == "completions" else choice["delta"].get("content")
        texts.setdefault(choice["index"], []).append(piece or "")
        if choice["finish_reason"]:
          finish[choice["index"]] = choice["finish_reason"]
  return {i: ("".join(parts), finish[i]) for i, parts in texts.items()}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["completions", "chat/completions"])
@pytest.mark.parametrize("schema_name", sorted(SCHEMAS))
def test_json_schema_outputs_all_validate(server, path, schema_name, stream):
  """response_format json_schema, n = 4, greedy and sampled: every choice validates."""
  schema = SCHEMAS[schema_name]
  base = {"prompt": "Someone:"} if path == "completions" else {"messages": MESSAGES}
  for temperature in (0.0, 1.0):
    body = {
      **base,
      "n": 4,
      "temperature": temperature,
      "max_tokens": MAX_TOKENS,
      "seed": 1,
      "response_format": {
        "type": "json_schema",
        "json_schema": {"name": schema_name, "schema": schema},
      },
    }
    if stream:
      choices = _streamed_texts(server, path, body)
    else:
      response = _post(server, path, body)
      assert response.status_code == 200, response.text
      choices = {
        c["index"]: (
          c["text"] if path == "completions" else c["message"]["content"],
          c["finish_reason"],
        )
        for c in response.json()["choices"]
      }
    assert sorted(choices) == [0, 1, 2, 3]
    for text, finish_reason in choices.values():
      assert finish_reason == "stop", text
      assert_valid_json(text, schema)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_regex_choice_and_json_object_through_structured_outputs(server, stream):
  cases = [
    ({"regex": REGEX}, assert_regex),
    ({"choice": list(CHOICES)}, lambda text: text in CHOICES or pytest.fail(text)),
    ({"json_object": True}, lambda text: isinstance(json.loads(text), dict)),
  ]
  for constraint, check in cases:
    body = {
      "prompt": "Answer:",
      "n": 2,
      "temperature": 1.0,
      "seed": 3,
      "max_tokens": MAX_TOKENS,
      "structured_outputs": constraint,
    }
    if stream:
      choices = list(_streamed_texts(server, "completions", body).values())
    else:
      response = _post(server, "completions", body)
      assert response.status_code == 200, response.text
      choices = [(c["text"], c["finish_reason"]) for c in response.json()["choices"]]
    for text, finish_reason in choices:
      if constraint != {"json_object": True}:  # an open object may run to max_tokens
        assert finish_reason == "stop"
        check(text)


def test_max_tokens_still_ends_with_length(server):
  body = {
    "messages": MESSAGES,
    "max_tokens": 4,
    "temperature": 0,
    "response_format": {
      "type": "json_schema",
      "json_schema": {"name": "p", "schema": SCHEMAS["person"]},
    },
  }
  choice = _post(server, "chat/completions", body).json()["choices"][0]
  assert choice["finish_reason"] == "length"


@pytest.mark.parametrize(
  "path,body,param",
  [
    (
      "completions",
      {"prompt": "x", "structured_outputs": {"regex": "(("}},
      "structured_outputs.regex",
    ),
    (
      "chat/completions",
      {
        "messages": MESSAGES,
        "response_format": {
          "type": "json_schema",
          "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
        },
      },
      "response_format.json_schema.schema",
    ),
    (
      "completions",
      {"prompt": "x", "structured_outputs": {"grammar": "start: nothing_here"}},
      "structured_outputs.grammar",
    ),
    ("completions", {"prompt": "x", "response_format": {"type": "xml"}}, "response_format.type"),
    (
      "chat/completions",
      {
        "messages": MESSAGES,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "nope"}},
      },
      "tool_choice.function.name",
    ),
    (
      "chat/completions",
      {
        "messages": MESSAGES,
        "tools": [WEATHER],
        "tool_choice": "required",
        "response_format": {"type": "json_object"},
      },
      "tool_choice",
    ),
  ],
)
def test_bad_constraints_are_400_naming_the_field(server, path, body, param):
  response = _post(server, path, body)
  assert response.status_code == 400, response.text
  assert response.json()["error"]["param"] == param
  assert wait_for_idle(server.url)["jaxserve_kv_pages_used"] == 0


class Address(pydantic.BaseModel):
  city: Literal["Paris", "Oslo"]
  floor: int = pydantic.Field(ge=0, le=20)


class Person(pydantic.BaseModel):
  name: str = pydantic.Field(max_length=6)
  role: Literal["admin", "user"]
  address: Address
  tags: list[Literal["x", "y"]] = pydantic.Field(max_length=2)


def test_openai_parse_with_a_pydantic_model(client):
  completion = client.chat.completions.parse(
    model=client.model_name,
    messages=MESSAGES,
    response_format=Person,
    max_tokens=MAX_TOKENS,
    temperature=1.0,
    n=2,
    seed=5,
  )
  for choice in completion.choices:
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    jsonschema.validate(json.loads(choice.message.content), Person.model_json_schema())


def _tool_call_reply(client, stream: bool, tool_choice) -> tuple[list[dict], str]:
  """The assistant's tool calls (as OpenAI message dicts) and the finish reason."""
  kwargs = dict(
    model=client.model_name,
    messages=MESSAGES,
    tools=[WEATHER, TIME],
    tool_choice=tool_choice,
    max_tokens=MAX_TOKENS,
    temperature=1.0,
    seed=2,
  )
  if not stream:
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.message.content is None
    return [call.model_dump() for call in choice.message.tool_calls], choice.finish_reason
  calls: dict[int, dict] = {}
  finish_reason = None
  for chunk in client.chat.completions.create(**kwargs, stream=True):
    for choice in chunk.choices:
      for delta in choice.delta.tool_calls or ():
        call = calls.setdefault(
          delta.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        call["id"] = delta.id or call["id"]
        call["function"]["name"] += delta.function.name or ""
        call["function"]["arguments"] += delta.function.arguments or ""
      finish_reason = choice.finish_reason or finish_reason
  return [calls[i] for i in sorted(calls)], finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("tool_choice", ["required", "named"])
def test_tool_calling_round_trip(client, stream, tool_choice):
  """tools -> a tool_calls reply (forced by the constraint, so a random model makes valid
  calls) -> the tool's answer as a `tool` message -> a final answer without calls."""
  choice = (
    "required"
    if tool_choice == "required"
    else {"type": "function", "function": {"name": "get_weather"}}
  )
  calls, finish_reason = _tool_call_reply(client, stream, choice)
  assert finish_reason == "tool_calls"
  assert calls and all(call["id"].startswith("call_") for call in calls)
  tools = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
  for call in calls:
    jsonschema.validate(json.loads(call["function"]["arguments"]), tools[call["function"]["name"]])
  if tool_choice == "named":
    assert [call["function"]["name"] for call in calls] == ["get_weather"]
  messages = (
    MESSAGES
    + [{"role": "assistant", "content": None, "tool_calls": calls}]
    + [{"role": "tool", "tool_call_id": call["id"], "content": "12 degrees"} for call in calls]
  )
  final = client.chat.completions.create(
    model=client.model_name,
    messages=messages,
    tools=[WEATHER, TIME],
    tool_choice="none",
    max_tokens=8,
    temperature=0,
  )
  answer = final.choices[0]
  assert answer.message.tool_calls is None and isinstance(answer.message.content, str)
  assert answer.finish_reason in ("stop", "length")
