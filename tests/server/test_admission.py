"""Admission: server.max_waiting_requests counts HTTP requests (not choices) until they start,
so a burst below it is never refused while one above it still gets 429; `n` above server.max_n
is a 400 naming n, which the openai client does not retry."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import openai
import pytest

from jaxserve.config.loader import load_config
from tests.server.server_helpers import start_server, wait_for_idle

LIMIT = 64


@pytest.fixture(scope="module")
def small_queue(served):
  server = start_server(served.backend, max_waiting_requests=LIMIT, max_n=4)
  yield server
  server.stop()


POOL = 50  # connections per client: httpcore scans its whole pool for each request it sends


async def _burst(url: str, count: int, n: int, max_tokens: int, stream: bool = False) -> list[int]:
  """`count` completions sent at once; their status codes (streams read to the end). One
  client per POOL requests (one pool of 1000 connections spent ~10 s of the test process's CPU,
  beside the API server's, in its quadratic scan)."""
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
  async with contextlib.AsyncExitStack() as stack:
    clients = [
      await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=120))
      for _ in range(-(-count // POOL))
    ]

    async def one(i: int) -> int:
      body = {
        "prompt": f"burst {i}",
        "max_tokens": max_tokens,
        "n": n,
        "ignore_eos": True,
        "stream": stream,
      }
      client = clients[i % len(clients)]
      async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        await response.aread()
        return response.status_code

    return list(await asyncio.gather(*(one(i) for i in range(count))))


@pytest.mark.parametrize("n,stream", [(1, False), (4, False), (2, True)])
def test_a_burst_below_the_limit_is_never_refused(served, small_queue, n, stream):
  # 63 requests of n choices each on an engine that runs 16 sequences at a time: most wait
  statuses = asyncio.run(_burst(small_queue.url, LIMIT - 1, n, max_tokens=8, stream=stream))
  assert statuses == [200] * (LIMIT - 1)
  assert wait_for_idle(small_queue.url)["jaxserve_num_http_requests_waiting"] == 0


def test_the_issue_burst_1000_below_1024(served):
  """Issue 15's case: 1000 requests at once against the default limit of 1024 (the old check
  added the engine's waiting count to the places reserved by handlers, counting a just-added
  request twice: with these 8-token requests it refused some of the 1000 on a CPU engine)."""
  assert served.server.state.config.max_waiting_requests == 1024
  statuses = asyncio.run(_burst(served.url, 1000, 1, max_tokens=8))
  assert statuses == [200] * 1000
  assert wait_for_idle(served.url)["jaxserve_num_http_requests_waiting"] == 0


def test_a_burst_above_the_limit_gets_429_and_gives_every_place_back(served, small_queue):
  statuses = asyncio.run(_burst(small_queue.url, 3 * LIMIT, 1, max_tokens=64))
  assert set(statuses) == {200, 429}
  assert statuses.count(200) >= LIMIT
  assert wait_for_idle(small_queue.url)["jaxserve_num_http_requests_waiting"] == 0


def test_n_above_max_n_is_400_naming_n(served, small_queue):
  for url, n in ((small_queue.url, 5), (served.url, 129), (served.url, 10**9)):
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused") as client:  # default retries
      with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny-random", prompt="hi", max_tokens=1, n=n)
      assert caught.value.status_code == 400
      assert caught.value.body["param"] == "n" and str(n) in caught.value.body["message"]
      with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
          model="tiny-random", max_tokens=1, n=n, messages=[{"role": "user", "content": "hi"}]
        )
      assert caught.value.body["param"] == "n"
  with openai.OpenAI(base_url=f"{small_queue.url}/v1", api_key="unused") as client:
    full = client.completions.create(model="tiny-random", prompt="hi", max_tokens=2, n=4)
    assert sorted(c.index for c in full.choices) == [0, 1, 2, 3]
  assert wait_for_idle(served.url)["jaxserve_num_http_requests_waiting"] == 0


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "many"])
def test_max_n_is_validated(value):
  with pytest.raises(ValueError, match=r"^server\.max_n: must be an integer >= 1"):
    load_config(overrides=[f"server.max_n={value}"])
  assert load_config(overrides=["server.max_n=8"]).server.max_n == 8


def test_api_servers_share_one_limit(served, small_queue):
  """Two API servers (CoreClients) on one engine core, each with the limit: the core counts
  for both, so LIMIT requests sent to each (2 x LIMIT at once) cannot all wait; each server
  counting alone would admit all of them."""
  other = start_server(served.backend, max_waiting_requests=LIMIT, max_n=4)
  try:

    async def both() -> list[int]:
      first, second = await asyncio.gather(
        _burst(small_queue.url, LIMIT, 1, max_tokens=64), _burst(other.url, LIMIT, 1, max_tokens=64)
      )
      return first + second

    statuses = asyncio.run(both())
  finally:
    other.stop()
  assert set(statuses) == {200, 429}
  assert statuses.count(200) >= LIMIT
  assert wait_for_idle(small_queue.url)["jaxserve_num_http_requests_waiting"] == 0
