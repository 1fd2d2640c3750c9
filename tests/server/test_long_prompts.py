"""Prompts of megabytes on a real API server over the session's engine core: one too long for the
context is refused before it is tokenized in full (400, context_length_exceeded) where the
tokenizer's byte bound proves it (tiny-random's byte tokenizer: 13 bytes a token at most, its
longest special token), else before its ids are built; meanwhile the API server's event loop
answers /health (the tokenizers library held the GIL through a 3 MB encode: /health took 16 s).
server/prompt_length.py, tokenizer/token_bound.py."""

from __future__ import annotations

import dataclasses
import threading
import time

import httpx
import pytest

from jaxserve.bench.vocab_tokenizer import write_vocab_tokenizer
from jaxserve.core.client import CoreClient
from jaxserve.tokenizer.tokenizer import load_tokenizer
from tests.server.server_helpers import start_server

THREE_MB = 3_000_000


def _post(url: str, path: str, body: dict) -> tuple[httpx.Response, float]:
  start = time.monotonic()
  response = httpx.post(f"{url}{path}", json=body, timeout=120)
  return response, time.monotonic() - start


def _error(response: httpx.Response, param: str) -> str:
  assert response.status_code == 400, response.text
  error = response.json()["error"]
  assert error["code"] == "context_length_exceeded" and error["param"] == param, error
  return error["message"]


def test_a_3_mb_prompt_is_refused_from_its_bytes_at_once(served):
  """It used to be tokenized in full first (3 million tokens: 14-18 s here)."""
  text = "x" * THREE_MB
  rendered = len("<s><|user|>") + THREE_MB + len("<|end|><|assistant|>")  # the chat template's
  cases = [  # ceil(bytes / 13), and bos where encode adds it
    ("/v1/completions", {"prompt": text}, "prompt", f"at least {-(-THREE_MB // 13) + 1} prompt"),
    (
      "/v1/chat/completions",
      {"messages": [{"role": "user", "content": text}]},
      "messages",
      f"has at least {-(-rendered // 13)} tokens, which leaves no room",
    ),
  ]
  for path, body, param, message in cases:
    response, seconds = _post(served.url, path, body)
    assert message in _error(response, param)
    assert seconds < 2, f"{path}: {seconds:.1f} s"


def test_prompts_of_many_bytes_that_fit_are_served(served):
  """13 bytes can be one token: a byte bound of 1 token per byte would refuse these. The chat
  template's own tokens count exactly: `<s><|user|>` content `<|end|><|assistant|>`."""
  response, _ = _post(served.url, "/v1/completions", {"prompt": "<|assistant|>" * 200})
  assert response.status_code == 200, response.text
  assert response.json()["usage"]["prompt_tokens"] == 201  # bos and 200 tokens of 13 bytes
  max_tokens = 16
  fits = served.max_model_len - max_tokens - 4  # 4: the template's tokens
  for count, status in ((fits, 200), (fits + 1, 400)):
    messages = [{"role": "user", "content": "<|assistant|>" * count}]
    body = {"messages": messages, "max_tokens": max_tokens}
    response, _ = _post(served.url, "/v1/chat/completions", body)
    assert response.status_code == status, response.text
  assert f"{fits + 5} prompt tokens + max_tokens" in _error(response, "messages")


@pytest.fixture(scope="module")
def word_level(served, tmp_path_factory):
  """An API server over the session's core with a word-level tokenizer over the same 512 ids
  (as `--tokenizer DIR` would configure; random-weight checkpoints ship it): its unknown token
  stands for a whole word, so no byte bound is proven and a long prompt is tokenized in full."""
  directory = tmp_path_factory.mktemp("word-level")
  write_vocab_tokenizer(directory, served.backend.vocab_size, bos_id=256, eos_ids=[257])
  tokenizer = load_tokenizer(str(directory))
  assert tokenizer.max_bytes_per_token is None
  backend = dataclasses.replace(
    served.backend,
    tokenizer=tokenizer,
    make_client=lambda: CoreClient(served.core.address, tokenizer),
  )
  server = start_server(backend)
  yield server
  server.stop()


def _probe_health_while(url: str, path: str, body: dict) -> tuple[httpx.Response, list[int]]:
  """`path`'s response to `body`, and the milliseconds of each /health probe sent meanwhile."""
  result: list[httpx.Response] = []
  post = threading.Thread(target=lambda: result.append(_post(url, path, body)[0]))
  probes = []
  with httpx.Client(base_url=url, timeout=60) as client:
    post.start()
    while post.is_alive():
      start = time.perf_counter()
      assert client.get("/health").status_code == 200
      probes.append(round(1e3 * (time.perf_counter() - start)))
      time.sleep(0.02)
  post.join()
  return result[0], sorted(probes)


def test_health_answers_within_100_ms_while_a_3_mb_prompt_is_tokenized(served, word_level):
  """Nine probes in ten within 100 ms, none past a second (the old code: every probe waited for
  the whole encode, seconds). The tokenizer takes one of the machine's cores; a probe may wait
  for the other, which the test process and other test workers share. Through the word-level
  tokenizer the completion is tokenized in full and refused from its count; /tokenize on
  tiny-random returns 3 million ids (built and written to JSON in the thread pool too)."""
  prompt = ("user assistant a bb ccc " * (THREE_MB // 24 + 1))[:THREE_MB]
  response, probes = _probe_health_while(word_level.url, "/v1/completions", {"prompt": prompt})
  assert "625001 prompt tokens + max_tokens 16" in _error(response, "prompt")  # counted in full
  assert len(probes) >= 10 and probes[len(probes) * 9 // 10] < 100 and probes[-1] < 1000, probes
  response, probes = _probe_health_while(served.url, "/tokenize", {"prompt": "x" * THREE_MB})
  assert response.json()["count"] == THREE_MB + 1
  assert len(probes) >= 10 and probes[len(probes) * 9 // 10] < 100 and probes[-1] < 1000, probes
