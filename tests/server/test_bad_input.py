"""Every bad input gets its 4xx and OpenAI error body, never a 5xx, while a stream that was
already running completes with the right text. Also the API key, body limit and queue limit."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY
from tests.server.server_helpers import scrape_metrics

MODEL = "tiny-random"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hello"}]


def _nested(levels: int) -> list:
  """An array `levels` deep: [[...[]...]]."""
  value: list = []
  for _ in range(levels - 1):
    value = [value]
  return value


DEEP_BODY = b'{"prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}"  # 2 KB, 1,001 levels

# (path, body, status, param, code); a bytes body is sent as it is.
CASES = [
  (COMPLETIONS, b"{not json", 400, None, None),
  (COMPLETIONS, DEEP_BODY, 400, None, None),
  ("/tokenize", {"messages": _nested(128)}, 400, None, None),
  (COMPLETIONS, b"[1, 2, 3]", 400, None, None),
  (COMPLETIONS, b"\xff\xfe", 400, None, None),
  (COMPLETIONS, {"prompt": ""}, 400, "prompt", None),
  (COMPLETIONS, {"prompt": []}, 400, "prompt", None),
  (COMPLETIONS, {}, 400, "prompt", None),
  (COMPLETIONS, {"prompt": ["ok", ""]}, 400, "prompt[1]", None),
  (COMPLETIONS, {"prompt": [1, 99999]}, 400, "prompt", None),
  (COMPLETIONS, {"prompt": [[1, 2], [-1]]}, 400, "prompt[1]", None),
  (COMPLETIONS, {"prompt": "x" * 300}, 400, "prompt", "context_length_exceeded"),
  (COMPLETIONS, {"prompt": "hi", "max_tokens": 300}, 400, "prompt", "context_length_exceeded"),
  (COMPLETIONS, {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens", None),
  (COMPLETIONS, {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens", None),
  (COMPLETIONS, {"prompt": "hi", "temperature": -1}, 400, "temperature", None),
  (COMPLETIONS, {"prompt": "hi", "temperature": "hot"}, 400, "temperature", None),
  (COMPLETIONS, {"prompt": "hi", "top_p": 0}, 400, "top_p", None),
  (COMPLETIONS, {"prompt": "hi", "top_k": -2}, 400, "top_k", None),
  (COMPLETIONS, {"prompt": "hi", "min_p": 2}, 400, "min_p", None),
  (COMPLETIONS, {"prompt": "hi", "presence_penalty": 5}, 400, "presence_penalty", None),
  (COMPLETIONS, {"prompt": "hi", "frequency_penalty": -3}, 400, "frequency_penalty", None),
  (COMPLETIONS, {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty", None),
  (COMPLETIONS, {"prompt": "hi", "logprobs": 21}, 400, "logprobs", None),
  (COMPLETIONS, {"prompt": "hi", "n": 0}, 400, "n", None),
  (COMPLETIONS, {"prompt": "hi", "n": 10**9}, 400, "n", None),  # above server.max_n (128)
  (CHAT, {"messages": USER, "n": 129}, 400, "n", None),
  (COMPLETIONS, {"prompt": "hi", "seed": -1}, 400, "seed", None),
  (COMPLETIONS, {"prompt": "hi", "stop": 5}, 400, "stop", None),
  (COMPLETIONS, {"prompt": "hi", "stop": [""]}, 400, "stop", None),
  (COMPLETIONS, {"prompt": "hi", "stop_token_ids": ["a"]}, 400, "stop_token_ids", None),
  (COMPLETIONS, {"prompt": "hi", "min_tokens": 20, "max_tokens": 5}, 400, "min_tokens", None),
  (COMPLETIONS, {"prompt": "hi", "echo": "yes"}, 400, "echo", None),
  (COMPLETIONS, {"prompt": "hi", "ignore_eos": 1}, 400, "ignore_eos", None),
  (COMPLETIONS, {"prompt": "hi", "stream": "yes"}, 400, "stream", None),
  (
    COMPLETIONS,
    {"prompt": "hi", "stream_options": {"include_usage": True}},
    400,
    "stream_options",
    None,
  ),
  (COMPLETIONS, {"prompt": "hi", "model": "other-model"}, 404, "model", "model_not_found"),
  (CHAT, {}, 400, "messages", None),
  (CHAT, {"messages": []}, 400, "messages", None),
  (CHAT, {"messages": [{"content": "no role"}]}, 400, "messages[0]", None),
  (CHAT, {"messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content", None),
  (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].tool_call_id", None),
  (CHAT, {"messages": [{"role": "critic", "content": "x"}]}, 400, "messages", None),
  (
    CHAT,
    {"messages": [{"role": "user", "content": "x" * 300}]},
    400,
    "messages",
    "context_length_exceeded",
  ),
  (CHAT, {"messages": USER, "max_tokens": 250}, 400, "messages", "context_length_exceeded"),
  (CHAT, {"messages": USER, "max_completion_tokens": 0}, 400, "max_completion_tokens", None),
  (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs", None),
  (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs", None),
  (CHAT, {"messages": USER, "model": "other-model"}, 404, "model", "model_not_found"),
  (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias", None),
  (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": -100.5}}, 400, "logit_bias", None),
  (COMPLETIONS, {"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "logit_bias", None),
  (COMPLETIONS, {"prompt": "hi", "logit_bias": {"-3": 1}}, 400, "logit_bias", None),
  (COMPLETIONS, {"prompt": "hi", "logit_bias": {"99999": 1}}, 400, "logit_bias", None),
  (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": "up"}}, 400, "logit_bias", None),
  (COMPLETIONS, {"prompt": "hi", "logit_bias": [5]}, 400, "logit_bias", None),
  (
    COMPLETIONS,
    {"prompt": "hi", "logit_bias": {str(i): 1 for i in range(301)}},
    400,
    "logit_bias",
    None,
  ),
  (CHAT, {"messages": USER, "logit_bias": {"99999": 1}}, 400, "logit_bias", None),
  (COMPLETIONS, {"prompt": "hi", "suffix": "x"}, 400, "suffix", None),
  (COMPLETIONS, {"prompt": "hi", "best_of": 2}, 400, "best_of", None),
  (CHAT, {"messages": USER, "chat_template_kwargs": [1]}, 400, "chat_template_kwargs", None),
  (
    CHAT,
    {"messages": USER, "chat_template_kwargs": {"tokenize": True}},
    400,
    "chat_template_kwargs.tokenize",
    None,
  ),
  (CHAT, {"messages": USER, "continue_final_message": "yes"}, 400, "continue_final_message", None),
  (CHAT, {"messages": USER, "continue_final_message": True}, 400, "continue_final_message", None),
  (CHAT, {"messages": USER, "echo": 1}, 400, "echo", None),
  (CHAT, {"messages": USER, "include_reasoning": "no"}, 400, "include_reasoning", None),
  (
    CHAT,
    {"messages": USER, "stream": True, "stream_options": {"continuous_usage_stats": 1}},
    400,
    "stream_options.continuous_usage_stats",
    None,
  ),
  ("/tokenize", {"prompt": "hi", "return_token_strs": "yes"}, 400, "return_token_strs", None),
  (
    "/tokenize",
    {"messages": USER, "add_generation_prompt": True, "continue_final_message": True},
    400,
    "continue_final_message",
    None,
  ),
  ("/tokenize", {}, 400, "prompt", None),
  ("/tokenize", {"messages": "nope"}, 400, "messages", None),
  ("/detokenize", {"tokens": [99999]}, 400, "tokens", None),
  ("/detokenize", {"tokens": "abc"}, 400, "tokens", None),
]


def _post(url: str, path: str, body, **kwargs) -> httpx.Response:
  content = body if isinstance(body, bytes) else json.dumps(body).encode()
  return httpx.post(
    f"{url}{path}",
    content=content,
    timeout=30,
    headers={"content-type": "application/json", **kwargs.pop("headers", {})},
    **kwargs,
  )


def _assert_error(
  response: httpx.Response,
  status: int,
  param=None,
  code=None,
  error_type: str | None = "invalid_request_error",
) -> dict:
  assert response.status_code == status, response.text
  error = response.json()["error"]
  assert set(error) == {"message", "type", "param", "code"}
  assert isinstance(error["message"], str) and error["message"]
  assert error["param"] == param
  assert error["code"] == code
  if error_type is not None:
    assert error["type"] == error_type
  return error


def test_bad_inputs_get_4xx_while_a_stream_runs(served):
  prompt, max_tokens = "a stream that keeps going", 120
  kwargs = dict(
    model=MODEL,
    prompt=prompt,
    max_tokens=max_tokens,
    temperature=0,
    extra_body={"ignore_eos": True},
  )
  client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
  expected = client.completions.create(**kwargs).choices[0].text
  streamed: list[str] = []
  first_chunk = threading.Event()

  def consume() -> None:
    for chunk in client.completions.create(stream=True, **kwargs):
      streamed.append(chunk.choices[0].text)
      first_chunk.set()

  thread = threading.Thread(target=consume)
  thread.start()
  assert first_chunk.wait(30)
  for path, body, status, param, code in CASES:
    response = _post(served.url, path, body)
    assert response.status_code < 500, (path, body, response.text)
    _assert_error(response, status, param, code)
  thread.join(60)
  assert "".join(streamed) == expected
  client.close()


def test_json_nested_past_the_limit_gets_400_naming_it(served):
  """A 2 KB body nested 1,000 levels deep used to end in a RecursionError (a 500 and a
  traceback); 128 levels of arrays and objects are allowed (the body itself is level 1)."""
  for body in (DEEP_BODY, {"prompt": _nested(128)}):
    error = _assert_error(_post(served.url, COMPLETIONS, body), 400)
    assert "more than 128 levels deep" in error["message"]
  within = _post(served.url, COMPLETIONS, {"prompt": _nested(127)})  # deep, but allowed
  assert "levels deep" not in _assert_error(within, 400, param="prompt[0]")["message"]


def test_unknown_routes_and_methods_get_openai_bodies(served):
  _assert_error(httpx.get(f"{served.url}/v1/nope"), 404, code="not_found")
  _assert_error(httpx.get(f"{served.url}{COMPLETIONS}"), 405, code="method_not_allowed")


def test_api_key(served, strict_server):
  url = strict_server.url
  body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
  _assert_error(_post(url, COMPLETIONS, body), 401, code="invalid_api_key")
  wrong = {"Authorization": "Bearer not-the-key"}
  _assert_error(_post(url, COMPLETIONS, body, headers=wrong), 401, code="invalid_api_key")
  _assert_error(
    httpx.get(f"{url}/v1/models", headers={"Host": "localhost"}), 401, code="invalid_api_key"
  )
  _assert_error(httpx.get(f"{url}/v1/models/tiny-random"), 401, code="invalid_api_key")
  # vLLM guards /v1 only: probes, scrapers and the utility routes need no key
  assert httpx.get(f"{url}/health").status_code == 200
  assert httpx.get(f"{url}/metrics").status_code == 200
  assert httpx.get(f"{url}/version").json()["version"]
  assert httpx.get(f"{url}/tokenizer_info").status_code == 200
  tokens = _post(url, "/tokenize", {"prompt": "hi"}).json()["tokens"]
  assert _post(url, "/detokenize", {"tokens": tokens}).json()["prompt"] == "hi"
  with openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0) as client:
    assert client.completions.create(**body).usage.completion_tokens >= 1
  with openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0) as client:
    with pytest.raises(openai.AuthenticationError):
      client.models.list()


def test_body_limit(strict_server):
  auth = {"Authorization": f"Bearer {API_KEY}"}
  big = {"model": MODEL, "prompt": "x" * 4000, "max_tokens": 1}
  _assert_error(
    _post(strict_server.url, COMPLETIONS, big, headers=auth), 413, code="request_too_large"
  )

  def chunks():  # no Content-Length: the limit is enforced while the body streams in
    payload = json.dumps(big).encode()
    for start in range(0, len(payload), 500):
      yield payload[start : start + 500]

  response = httpx.post(
    f"{strict_server.url}{COMPLETIONS}",
    content=chunks(),
    timeout=30,
    headers={"content-type": "application/json", **auth},
  )
  assert "content-length" not in response.request.headers
  _assert_error(response, 413, code="request_too_large")


def test_queue_full_gets_429(served, strict_server):
  """strict_server admits at most 2 waiting requests (counted across the apps of its engine);
  20 long ones on 16 slots leave 4 waiting."""
  stop = threading.Event()

  def long_stream() -> None:
    body = {"model": MODEL, "prompt": "busy", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{served.url}{COMPLETIONS}", json=body, timeout=60) as response:
      for _ in response.iter_lines():
        if stop.is_set():
          return

  threads = [threading.Thread(target=long_stream) for _ in range(20)]
  for thread in threads:
    thread.start()
  try:
    deadline = time.monotonic() + 20
    while scrape_metrics(served.url)["jaxserve_num_http_requests_waiting"] < 3:
      assert time.monotonic() < deadline
      time.sleep(0.02)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    one_more = {"model": MODEL, "prompt": "one more"}
    response = _post(strict_server.url, COMPLETIONS, one_more, headers=auth)
    _assert_error(response, 429, code="rate_limit_exceeded", error_type="rate_limit_error")
    # what can never be served is told so, however full the queue: never a 429
    never = {"model": MODEL, "prompt": [0, 1, 2], "max_tokens": served.max_model_len}
    response = _post(strict_server.url, COMPLETIONS, never, headers=auth)
    _assert_error(response, 400, param="prompt", code="context_length_exceeded")
    out_of_vocab = {"model": MODEL, "prompt": [1, 99999], "max_tokens": 1}
    response = _post(strict_server.url, COMPLETIONS, out_of_vocab, headers=auth)
    _assert_error(response, 400, param="prompt")
  finally:
    stop.set()
    for thread in threads:
      thread.join(30)


def test_draining_refuses_new_requests_but_keeps_probes(served):
  draining = served.server.state.draining
  draining.set()
  try:
    health = httpx.get(f"{served.url}/health")
    assert health.status_code == 503 and health.json()["status"] == "draining"
    response = _post(served.url, COMPLETIONS, {"model": MODEL, "prompt": "hi", "max_tokens": 1})
    _assert_error(response, 503, code="service_unavailable", error_type="service_unavailable")
    assert httpx.get(f"{served.url}/metrics").status_code == 200
  finally:
    draining.clear()
  assert httpx.get(f"{served.url}/health").status_code == 200


def test_a_stopped_engine_turns_health_and_generation_to_503(served, tmp_path):
  """An app whose engine core never answers: probes say so, requests get 503."""
  from jaxserve.core.client import CoreClient
  from tests.server.server_helpers import start_server

  nobody = CoreClient(f"ipc://{tmp_path}/no-core", served.tokenizer, connect_timeout_s=0.5)
  server = start_server(served.backend, nobody)
  try:
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 503 and health.json()["status"] == "engine stopped"
    response = _post(server.url, COMPLETIONS, {"model": MODEL, "prompt": "hi"})
    _assert_error(response, 503, code="service_unavailable", error_type="service_unavailable")
  finally:
    server.stop()
