"""The API server's CoreClient hands its streams one engine step at a time: when step messages
have queued up (the event loop was busy for several steps), a stream's reader takes each step's
output before the client takes the next message, instead of finding several steps' outputs
waiting at once (which a server would send as back-to-back chunks).

A real engine core (tiny-random, on a thread, as the one-process server runs it) and a real
CoreClient; the test's reader blocks the event loop for 0.3 s, as a busy API server would, while
the core runs every step of the request.
The client's step messages are tapped as they are taken (as tests/server/test_streaming.py
does) and interleaved with the reader's takes.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.core.client import CoreClient
from jaxserve.core.in_process import CoreThread
from jaxserve.core.streams import now
from jaxserve.engine.core_io import new_core_requests
from tests.server.server_helpers import build_server_engine

NUM_TOKENS = 12


@pytest.fixture(scope="module")
def core():
  thread = CoreThread(build_server_engine()).start()
  yield thread
  thread.stop()


def test_a_busy_clients_stream_takes_each_step_before_the_next(core):
  events: list[str] = []

  async def run() -> None:
    client = CoreClient(core.address, core.info.tokenizer)
    process = client._processor.process

    def tapped(outputs):
      events.append("step")
      return process(outputs)

    client._processor.process = tapped
    await client.attach()
    try:
      params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
      records = new_core_requests(
        ["probe"], (1, 2, 3), [params], core.info.vocab_size, arrival_time=now()
      )
      stream = await client.add(records, 1000)
      time.sleep(0.3)  # the event loop is busy: the core's step messages queue up
      while not stream.finished:
        output = await stream.get()
        events.extend("take" for _ in output.new_token_ids)
    finally:
      await client.detach()

  asyncio.run(run())
  assert events.count("take") == NUM_TOKENS
  steps = [i for i, event in enumerate(events) if event == "step"]
  assert len(steps) >= NUM_TOKENS  # one message per step of the request (bursts are off)
  for i in steps[:-1]:  # every step's output is taken before the next step's message
    assert events[i + 1] == "take", events
