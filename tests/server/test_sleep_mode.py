"""vLLM's sleep-mode routes (server/sleep_routes.py) on real uvicorn servers: absent without
VLLM_SERVER_DEV_MODE, a 400 naming enable_sleep_mode on an engine without it, and on a sleepy
engine core (a thread of this process, so its device arrays are visible here): level 1 frees the
weights and the KV pool, a request sent while asleep waits and completes after wake with the
greedy tokens it had before, running requests are aborted, nothing compiles, no page leaks."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
import jax
import openai
import pytest

from jaxserve.composition.assembly import build_engine
from jaxserve.core.in_process import CoreThread
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.server.sleep_routes import dev_mode
from tests.server.server_helpers import (
  RunningServer,
  core_backend,
  scrape_metrics,
  server_engine_config,
  start_server,
  wait_for_idle,
)

PROMPT = [3, 17, 29, 4, 11, 8, 5]


@dataclass(frozen=True)
class Sleepy:
  engine: LLMEngine
  server: RunningServer

  @property
  def url(self) -> str:
    return self.server.url


@pytest.fixture(scope="module")
def sleepy():
  config = server_engine_config(warmup="lazy").replace(enable_sleep_mode=True)
  engine = build_engine(config, show_progress=False)
  core = CoreThread(engine).start()
  server = start_server(core_backend(core), dev_mode=True)
  yield Sleepy(engine, server)
  server.stop()
  core.stop()


def greedy_tokens(url: str, max_tokens: int = 10) -> list[str]:
  with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
    completion = client.completions.create(
      model="tiny-random",
      prompt=PROMPT,
      max_tokens=max_tokens,
      temperature=0,
      logprobs=0,
      extra_body={"ignore_eos": True},
    )
  return completion.choices[0].logprobs.tokens


def live_bytes() -> int:
  return sum(a.nbytes for a in jax.live_arrays())


def test_dev_mode_reads_the_variable_as_vllm_does():
  assert dev_mode({"VLLM_SERVER_DEV_MODE": "1"}) and not dev_mode({"VLLM_SERVER_DEV_MODE": "0"})
  assert not dev_mode({})
  with pytest.raises(ValueError, match="^VLLM_SERVER_DEV_MODE: "):
    dev_mode({"VLLM_SERVER_DEV_MODE": "yes"})


def test_without_dev_mode_the_routes_are_not_served(served):
  for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
    response = httpx.request(method, f"{served.url}{path}", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_an_engine_without_sleep_mode_refuses_naming_the_flag(served):
  server = start_server(served.backend, dev_mode=True)
  try:
    response = httpx.post(f"{server.url}/sleep", timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "enable_sleep_mode"
    assert "--enable-sleep-mode" in response.json()["error"]["message"]
    response = httpx.get(f"{server.url}/is_sleeping", timeout=10)
    assert response.json() == {"is_sleeping": False}
  finally:
    server.stop()


def test_sleep_frees_memory_holds_requests_and_wake_gives_the_same_tokens(sleepy):
  before = greedy_tokens(sleepy.url)
  compiled = sleepy.engine.ledger.num_compilations
  runner = sleepy.engine.runner
  freed = sum(x.nbytes for x in jax.tree.leaves((runner.params, runner.kv_pages)))
  awake_bytes = live_bytes()
  response = httpx.post(f"{sleepy.url}/sleep", params={"level": "1"}, timeout=30)
  assert (response.status_code, response.content) == (200, b"")
  assert httpx.get(f"{sleepy.url}/is_sleeping", timeout=10).json() == {"is_sleeping": True}
  assert awake_bytes - live_bytes() >= freed
  assert scrape_metrics(sleepy.url)["jaxserve_engine_cores_sleeping"] == 1
  held: list[list[str]] = []
  waiter = threading.Thread(target=lambda: held.append(greedy_tokens(sleepy.url)))
  waiter.start()
  time.sleep(1.0)
  assert waiter.is_alive() and not held  # accepted, waiting for the wake
  response = httpx.post(f"{sleepy.url}/wake_up", timeout=30)
  assert (response.status_code, response.content) == (200, b"")
  waiter.join(30)
  assert held == [before]
  assert httpx.get(f"{sleepy.url}/is_sleeping", timeout=10).json() == {"is_sleeping": False}
  assert scrape_metrics(sleepy.url)["jaxserve_engine_cores_sleeping"] == 0
  assert live_bytes() >= awake_bytes - 1024  # the weights and the pool are back
  assert greedy_tokens(sleepy.url) == before
  assert sleepy.engine.ledger.num_compilations == compiled
  assert wait_for_idle(sleepy.url)["jaxserve_kv_pages_used"] == 0


def test_sleep_aborts_a_running_stream(sleepy):
  with openai.OpenAI(base_url=f"{sleepy.url}/v1", api_key="unused", max_retries=0) as client:
    stream = client.completions.create(
      model="tiny-random",
      prompt=PROMPT,
      max_tokens=200,
      temperature=0,
      stream=True,
      extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    next(chunks)  # the request runs
    assert httpx.post(f"{sleepy.url}/sleep", timeout=30).status_code == 200
    reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
  assert reasons[-1] == "abort"
  assert httpx.post(f"{sleepy.url}/wake_up", timeout=30).status_code == 200
  assert wait_for_idle(sleepy.url)["jaxserve_kv_pages_used"] == 0


@pytest.mark.parametrize(
  ("path", "params", "param"),
  [
    ("/sleep", {"level": "2"}, "level"),
    ("/sleep", {"level": "one"}, "level"),
    ("/sleep", {"mode": "keep"}, "mode"),
    ("/wake_up", {"tags": ["weights", "optimizer"]}, "tags"),
  ],
)
def test_bad_calls_are_400s_naming_the_field(sleepy, path, params, param):
  response = httpx.post(f"{sleepy.url}{path}", params=params, timeout=10)
  assert response.status_code == 400
  assert response.json()["error"]["param"] == param
  assert httpx.get(f"{sleepy.url}/is_sleeping", timeout=10).json() == {"is_sleeping": False}


def test_sleeping_twice_and_waking_by_tags(sleepy):
  for _ in range(2):
    assert httpx.post(f"{sleepy.url}/sleep", timeout=30).status_code == 200
  response = httpx.post(f"{sleepy.url}/wake_up", params={"tags": "weights"}, timeout=30)
  assert response.status_code == 200
  assert httpx.get(f"{sleepy.url}/is_sleeping", timeout=10).json() == {"is_sleeping": True}
  response = httpx.post(f"{sleepy.url}/wake_up", params={"tags": "kv_cache"}, timeout=30)
  assert response.status_code == 200
  assert httpx.post(f"{sleepy.url}/wake_up", timeout=30).status_code == 200  # awake: nothing
  assert httpx.get(f"{sleepy.url}/is_sleeping", timeout=10).json() == {"is_sleeping": False}
  assert len(greedy_tokens(sleepy.url, 3)) == 3
