"""The periodic stats line: nothing while idle; after traffic, the throughputs, running/waiting
requests and KV cache usage over the interval; logged from its own thread."""

from __future__ import annotations

import logging
import re
import time

import httpx

from jaxserve.server.stats_logger import StatsLogger
from tests.server.server_helpers import wait_for_idle

LINE = re.compile(
  r"^Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: "
  r"([\d.]+) tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs, "
  r"KV cache usage: ([\d.]+)%$"
)


def _complete(url: str, max_tokens: int) -> dict:
  body = {"prompt": "stats please", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
  response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
  response.raise_for_status()
  return response.json()


def test_tick_reports_the_interval_and_is_silent_when_idle(served):
  wait_for_idle(served.url)
  stats = StatsLogger(served.server.state.engine, served.server.state.metrics, interval_s=0)
  assert stats.tick() is None
  start = time.monotonic()
  usage = _complete(served.url, 20)["usage"]
  line = stats.tick()
  elapsed = time.monotonic() - start
  match = LINE.match(line)
  assert match, line
  prompt_rate, generation_rate = float(match.group(1)), float(match.group(2))
  # At least the tokens of this request over at least the time it took (others may run too).
  assert generation_rate >= 0.9 * 20 / (elapsed + 1.0)
  assert prompt_rate > 0 and usage["prompt_tokens"] > 0
  wait_for_idle(served.url)
  stats.tick()  # the tokens of anything that finished meanwhile
  assert stats.tick() is None


def test_thread_logs_lines_while_requests_run(served, caplog):
  caplog.set_level(logging.INFO, logger="jaxserve.server.stats_logger")
  stats = StatsLogger(
    served.server.state.engine, served.server.state.metrics, interval_s=0.05
  ).start()
  try:
    _complete(served.url, 60)
    time.sleep(0.2)
  finally:
    stats.stop()
  lines = [r.getMessage() for r in caplog.records if r.name == "jaxserve.server.stats_logger"]
  assert lines and all(LINE.match(line) for line in lines)
  assert any(float(LINE.match(line).group(2)) > 0 for line in lines)
