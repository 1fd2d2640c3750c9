"""Streaming like vLLM: a chunk per choice per engine step that produced tokens, even when the
detokenizer holds the text back; server.stream_interval K merges K steps per chunk; a decode burst
is one chunk with several tokens. The engine core process's per-step messages are recorded as
the API server's CoreClient receives them and compared with what real uvicorn servers stream."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import defaultdict

import httpx
import pytest

from jaxserve.config.loader import load_config
from jaxserve.core.client import CoreClient
from tests.server.server_helpers import (
  core_backend,
  server_engine_config,
  start_core,
  start_server,
  wait_for_idle,
)
from tests.tokenizer.tokenizer_checkpoints import llama3_checkpoint

# A byte-level BPE over 500 ids (the model samples ids below 512): random ids are often single
# bytes of multi-byte characters, which the detokenizer holds back until the character is whole.
PROMPT = "日本語のテキスト 🤖"
NUM_TOKENS = 40


class StepRecorder:
  """Taps the engine core's step messages as CoreClients receive them (each carries one engine
  step's outputs): each request's new token ids per step, in order."""

  def __init__(self):
    self.steps: dict[str, list[tuple[int, ...]]] = defaultdict(list)
    self._lock = threading.Lock()

  def tap(self, client: CoreClient) -> CoreClient:
    processor = client._processor
    process = processor.process

    def recording_process(outputs):
      outputs = list(outputs)
      with self._lock:
        for output in outputs:
          if output.new_token_ids:
            self.steps[output.request_id].append(tuple(output.new_token_ids))
      return process(outputs)

    processor.process = recording_process
    return client

  def of(self, response_id: str, choice: int = 0) -> list[tuple[int, ...]]:
    with self._lock:
      return list(self.steps[f"{response_id}-{choice}"])


def _serve(config, intervals: tuple[int, ...]):
  """An engine core process and a server (an API server with its own CoreClient) per
  stream_interval."""
  core = start_core(config)
  backend = core_backend(core)
  recorder = StepRecorder()
  servers = {
    k: start_server(backend, recorder.tap(backend.make_client()), stream_interval=k)
    for k in intervals
  }
  return backend, core, recorder, servers


@pytest.fixture(scope="module")
def held_back(tmp_path_factory):
  tokenizer_dir = llama3_checkpoint(str(tmp_path_factory.mktemp("bpe")), vocab_size=500)
  backend, core, recorder, servers = _serve(
    server_engine_config().replace(tokenizer=tokenizer_dir), (1, 3)
  )
  yield backend, recorder, servers
  for server in servers.values():
    server.stop()
  core.stop()


@pytest.fixture(scope="module")
def bursting():
  config = server_engine_config()
  config = config.replace(scheduler=dataclasses.replace(config.scheduler, num_scheduler_steps=4))
  backend, core, recorder, servers = _serve(config, (1,))
  yield backend, recorder, servers[1]
  servers[1].stop()
  core.stop()


def _stream(url: str, path: str, body: dict) -> list[dict]:
  """Every SSE event's JSON, in order; the stream must end with [DONE]."""
  events, done = [], False
  body = {**body, "stream": True, "stream_options": {"include_usage": True}}
  with httpx.stream("POST", f"{url}{path}", json=body, timeout=60) as response:
    assert response.status_code == 200
    for line in response.iter_lines():
      if not line.startswith("data: "):
        continue
      assert not done
      if line == "data: [DONE]":
        done = True
      else:
        events.append(json.loads(line[len("data: ") :]))
  assert done
  return events


def _completion_chunks(url: str, **fields) -> tuple[str, list[dict], dict]:
  body = {
    "prompt": PROMPT,
    "max_tokens": NUM_TOKENS,
    "temperature": 0,
    "ignore_eos": True,
    "logprobs": 0,
    **fields,
  }
  events = _stream(url, "/v1/completions", body)
  *chunks, usage = events
  assert usage["choices"] == [] and all(len(c["choices"]) == 1 for c in chunks)
  return chunks[0]["id"], [c["choices"][0] for c in chunks], usage["usage"]


def test_a_chunk_per_step_even_when_the_text_is_held_back(held_back):
  engine, recorder, servers = held_back
  url = servers[1].url
  response_id, chunks, usage = _completion_chunks(url)
  steps = recorder.of(response_id)
  assert usage["completion_tokens"] == NUM_TOKENS == len(steps) == len(chunks)
  assert all(len(step) == 1 for step in steps)
  tokenizer = engine.tokenizer
  ids = [step[0] for step in steps]
  for chunk, token_id in zip(
    chunks, ids, strict=True
  ):  # one logprobs entry per token: the step's token
    assert chunk["logprobs"]["tokens"] == tokenizer.convert_ids_to_tokens([token_id])
  assert [c["finish_reason"] for c in chunks] == [None] * (NUM_TOKENS - 1) + ["length"]
  assert sum(c["text"] == "" for c in chunks) >= 3  # held-back bytes still get their chunk
  text = "".join(c["text"] for c in chunks)
  assert text == tokenizer.decode(ids)
  full = httpx.post(
    f"{url}/v1/completions",
    timeout=60,
    json={
      "prompt": PROMPT,
      "max_tokens": NUM_TOKENS,
      "temperature": 0,
      "ignore_eos": True,
      "logprobs": 0,
    },
  ).json()
  assert full["choices"][0]["text"] == text
  assert full["choices"][0]["logprobs"]["tokens"] == tokenizer.convert_ids_to_tokens(ids)
  wait_for_idle(url)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_without_logprobs_still_a_chunk_per_token(held_back, path):
  engine, recorder, servers = held_back
  body = {"max_tokens": NUM_TOKENS, "temperature": 0, "ignore_eos": True}
  if path == "/v1/completions":
    body["prompt"] = PROMPT
  else:
    body["messages"] = [{"role": "user", "content": PROMPT}]
  *chunks, usage = _stream(servers[1].url, path, body)
  choices = [c["choices"][0] for c in chunks]
  if path != "/v1/completions":
    choices = choices[1:]  # the role chunk
  texts = [c.get("text", c.get("delta", {}).get("content")) for c in choices]
  assert usage["usage"]["completion_tokens"] == NUM_TOKENS == len(choices)
  assert texts.count("") >= 3 and None not in texts
  ids = [step[0] for step in recorder.of(chunks[0]["id"])]
  assert "".join(texts) == engine.tokenizer.decode(ids)
  assert choices[-1]["finish_reason"] == "length"


def test_chat_chunks_per_step_with_logprobs(held_back):
  engine, recorder, servers = held_back
  body = {
    "messages": [{"role": "user", "content": PROMPT}],
    "max_tokens": NUM_TOKENS,
    "temperature": 0,
    "ignore_eos": True,
    "logprobs": True,
  }
  *chunks, usage = _stream(servers[1].url, "/v1/chat/completions", body)
  role, *tokens = [c["choices"][0] for c in chunks]
  assert role["delta"] == {"role": "assistant", "content": ""}
  steps = recorder.of(chunks[0]["id"])
  assert usage["usage"]["completion_tokens"] == NUM_TOKENS == len(steps) == len(tokens)
  for choice, step in zip(tokens, steps, strict=True):
    assert set(choice["delta"]) == {"content"}
    (entry,) = choice["logprobs"]["content"]
    assert entry["token"] == engine.tokenizer.convert_ids_to_tokens(step)[0]
  assert [c["finish_reason"] for c in tokens] == [None] * (NUM_TOKENS - 1) + ["length"]
  assert any(c["delta"]["content"] == "" for c in tokens)
  assert "".join(c["delta"]["content"] for c in tokens) == engine.tokenizer.decode(
    [step[0] for step in steps]
  )


def test_stream_interval_merges_steps(held_back):
  engine, recorder, servers = held_back
  response_id, chunks, usage = _completion_chunks(servers[3].url, n=2, seed=5, temperature=1.0)
  by_choice = defaultdict(list)
  for chunk in chunks:
    by_choice[chunk["index"]].append(chunk)
  assert sorted(by_choice) == [0, 1] and usage["completion_tokens"] == 2 * NUM_TOKENS
  for index, choice_chunks in by_choice.items():
    steps = recorder.of(response_id, index)
    # the first step at once, then three steps a chunk; the last chunk has what is left
    groups = [steps[:1]] + [steps[i : i + 3] for i in range(1, len(steps), 3)]
    assert len(choice_chunks) == len(groups) == 1 + -(-(NUM_TOKENS - 1) // 3)
    for chunk, group in zip(choice_chunks, groups, strict=True):
      ids = [token for step in group for token in step]
      assert chunk["logprobs"]["tokens"] == engine.tokenizer.convert_ids_to_tokens(ids)
    assert [c["finish_reason"] for c in choice_chunks][-1] == "length"
    assert all(c["finish_reason"] is None for c in choice_chunks[:-1])
    ids = [token for step in steps for token in step]
    assert "".join(c["text"] for c in choice_chunks) == engine.tokenizer.decode(ids)


def test_a_decode_burst_is_one_chunk_with_its_tokens(bursting):
  engine, recorder, server = bursting
  response_id, chunks, usage = _completion_chunks(server.url, prompt="burst", max_tokens=17)
  steps = recorder.of(response_id)
  assert usage["completion_tokens"] == 17 == sum(len(step) for step in steps)
  assert max(len(step) for step in steps) == 4  # bursts of num_scheduler_steps tokens
  assert len(chunks) == len(steps)
  for chunk, step in zip(chunks, steps, strict=True):
    assert chunk["logprobs"]["tokens"] == engine.tokenizer.convert_ids_to_tokens(step)
  assert chunks[-1]["finish_reason"] == "length"


@pytest.mark.parametrize("value", [0, -2, 2.5, False, "x"])
def test_stream_interval_is_validated(value):
  with pytest.raises(ValueError, match=r"^server\.stream_interval: must be an integer >= 1"):
    load_config(overrides=[f"server.stream_interval={value}"])
  assert load_config().server.stream_interval == 1
