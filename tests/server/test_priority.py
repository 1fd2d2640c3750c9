"""vLLM's `priority` request field over HTTP, with the official openai client (extra_body) against
real uvicorn servers: on a server scheduling by priority (--scheduling-policy priority) a request
with a lower value overtakes the ones waiting before it; on an fcfs server (the shared `served`)
a non-zero priority is a 400 naming the field, 0 is accepted; a priority that is not an integer
is a 400 naming it on both endpoints."""

from __future__ import annotations

import dataclasses
import threading
import time

import openai
import pytest

from jaxserve.composition.assembly import build_engine
from jaxserve.core.in_process import CoreThread
from tests.integration.engine_helpers import small_config
from tests.server.server_helpers import core_backend, scrape_metrics, start_server, wait_for_idle

MODEL = "tiny-random"
MESSAGES = [{"role": "user", "content": "hi"}]


def _client(url: str) -> openai.OpenAI:
  return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def _create(client: openai.OpenAI, endpoint: str, priority: object, max_tokens: int = 2):
  if endpoint == "chat":
    return client.chat.completions.create(
      model=MODEL, messages=MESSAGES, max_tokens=max_tokens, extra_body={"priority": priority}
    )
  return client.completions.create(
    model=MODEL, prompt="hi", max_tokens=max_tokens, extra_body={"priority": priority}
  )


@pytest.fixture(scope="module")
def priority_server():
  """One sequence at a time, scheduled by priority: a core on a thread of the test process,
  its programs compiled on first use."""
  config = small_config(max_num_seqs=1, seq_buckets=(2,), token_buckets=(64,))
  config = dataclasses.replace(
    config, scheduler=dataclasses.replace(config.scheduler, policy="priority")
  )
  core = CoreThread(build_engine(config, show_progress=False, default_warmup="lazy")).start()
  server = start_server(core_backend(core))
  yield server
  server.stop()
  core.stop()


def _wait_for_waiting(url: str, count: int) -> None:
  deadline = time.monotonic() + 30
  while scrape_metrics(url)["jaxserve_num_requests_waiting"] < count:
    assert time.monotonic() < deadline, f"{count} requests never waited"
    time.sleep(0.02)


def test_a_lower_priority_value_overtakes_the_waiting_requests(priority_server):
  url = priority_server.url
  client = _client(url)
  blocker = client.completions.create(
    model=MODEL,
    prompt="hold the only slot",
    max_tokens=200,
    stream=True,
    extra_body={"ignore_eos": True},
  )
  next(iter(blocker))  # running: the others wait behind it
  finished: list[str] = []
  threads = []
  for count, (name, priority) in enumerate((("b", 0), ("c", 0), ("urgent", -1)), start=1):

    def send(name=name, priority=priority) -> None:
      result = _create(client, "completions", priority, max_tokens=8)
      assert result.choices[0].finish_reason is not None
      finished.append(name)

    threads.append(threading.Thread(target=send))
    threads[-1].start()
    _wait_for_waiting(url, count)  # in the queue before the next one arrives
  blocker.close()  # aborts it: the slot goes to the most urgent waiting request
  for thread in threads:
    thread.join(60)
  assert finished == ["urgent", "b", "c"]
  assert wait_for_idle(url)["jaxserve_num_requests_waiting"] == 0
  client.close()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_priority_reaches_a_priority_server_on_both_endpoints(priority_server, endpoint):
  client = _client(priority_server.url)
  assert _create(client, endpoint, -3).choices[0].finish_reason == "length"
  assert _create(client, endpoint, 2.0).choices[0].finish_reason == "length"  # JSON's 2.0 is 2
  client.close()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_non_zero_priority_on_an_fcfs_server_is_400_naming_it(served, endpoint):
  client = _client(served.url)
  with pytest.raises(openai.BadRequestError) as caught:
    _create(client, endpoint, 1)
  assert caught.value.status_code == 400
  assert caught.value.body["param"] == "priority"
  assert "--scheduling-policy priority" in caught.value.body["message"]
  assert _create(client, endpoint, 0).choices[0].finish_reason == "length"
  assert _create(client, endpoint, None).choices[0].finish_reason == "length"  # null: default
  client.close()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("value", ["high", "1", 1.5, True, [1], {"value": 1}])
def test_a_priority_that_is_not_an_integer_is_400_naming_it(served, endpoint, value):
  client = _client(served.url)
  with pytest.raises(openai.BadRequestError) as caught:
    _create(client, endpoint, value)
  assert caught.value.body["param"] == "priority"
  assert "integer" in caught.value.body["message"]
  client.close()
