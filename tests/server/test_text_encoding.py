"""Lone UTF-16 surrogates in any text field of any endpoint get a 400 naming the field (never a
5xx), and the keep-alive connection that sent them goes on serving. Raw JSON bytes with
`\\ud800` escapes (the openai client refuses to encode such strings itself)."""

from __future__ import annotations

import json

import httpx

USER = [{"role": "user", "content": "hello"}]
BAD = "x\ud800y"
TOOL = {"type": "function", "function": {"name": "f", "description": BAD, "parameters": {}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}

# (path, body, param)
CASES = [
  ("/v1/completions", {"prompt": BAD}, "prompt"),
  ("/v1/completions", {"prompt": ["ok", BAD]}, "prompt[1]"),
  ("/v1/completions", {"prompt": "hi", "stop": BAD}, "stop"),
  ("/v1/completions", {"prompt": "hi", "stop": ["a", BAD]}, "stop[1]"),
  ("/v1/completions", {"prompt": "hi", "model": BAD}, "model"),
  ("/v1/completions", {"prompt": "hi", "user": BAD}, "user"),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
  (
    "/v1/chat/completions",
    {"messages": [{"role": "user", "content": [{"type": "text", "text": BAD}]}]},
    "messages[0].content[0].text",
  ),
  ("/v1/chat/completions", {"messages": [{"role": BAD, "content": "x"}]}, "messages[0].role"),
  ("/v1/chat/completions", {"messages": USER, "stop": [BAD]}, "stop[0]"),
  ("/v1/chat/completions", {"messages": USER, "tools": [TOOL]}, "tools[0].function.description"),
  (
    "/v1/chat/completions",
    {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": BAD}}},
    "response_format.json_schema.name",
  ),
  ("/v1/chat/completions", {"messages": USER, BAD: 1}, "body"),
  (
    "/v1/chat/completions",
    {"messages": [{"role": "assistant", "content": "", "tool_calls": [CALL]}, *USER]},
    "messages[0].tool_calls[0].function.arguments.a",
  ),
  ("/tokenize", {"prompt": BAD}, "prompt"),
  ("/tokenize", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
  ("/detokenize", {"tokens": [1], "model": BAD}, "model"),
]


def _raw(body: dict) -> bytes:
  """JSON with every non-ASCII character escaped: lone surrogates as `\\udXXX`."""
  return json.dumps(body, ensure_ascii=True).encode("ascii")


def test_lone_surrogates_get_400_naming_the_field_and_the_connection_lives(served):
  headers = {"content-type": "application/json"}
  with httpx.Client(base_url=served.url, timeout=30, headers=headers) as client:
    for path, body, param in CASES:
      response = client.post(path, content=_raw(body))
      assert response.status_code == 400, (path, body, response.text)
      error = response.json()["error"]
      assert error["param"] == param, (path, error)
      assert error["type"] == "invalid_request_error"
      assert "surrogate" in error["message"] or "Unicode" in error["message"]
      assert response.headers.get("connection") != "close"
      ok = client.post("/tokenize", content=_raw({"prompt": "still here \U0001f600"}))
      assert ok.status_code == 200, ok.text
    # paired surrogate escapes are one valid character, not an error
    emoji = b'{"prompt": "\\ud83d\\ude00", "max_tokens": 1}'
    assert client.post("/v1/completions", content=emoji).status_code == 200
