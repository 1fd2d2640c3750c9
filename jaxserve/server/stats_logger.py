"""The periodic stats line of `jaxserve serve` (vLLM's): every server.stats_interval_s seconds,
while something happened, one INFO line with the prompt and generation throughput over the
interval, the running and waiting requests and the KV cache usage:

    Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 96.0 tokens/s,
    Running: 4 reqs, Waiting: 0 reqs, KV cache usage: 3.1%

Token counts are the app's Prometheus counters (prompt tokens are counted when a request
finishes), the rest the engine core's stats snapshot; nothing here touches the engine.
An idle server logs nothing. With several API server processes each logs its own line (its own
requests' tokens, prefixed "API server K: "), and the engine's counts are the shared core's.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from jaxserve.core.dp_client import EngineClient
from jaxserve.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenTotals:
  prompt: float
  generation: float
  time: float


class StatsLogger:
  """tick() computes and logs one line; start() calls it every interval_s on a daemon thread."""

  def __init__(
    self, engine: EngineClient, metrics: ServerMetrics, interval_s: float, prefix: str = ""
  ):
    self._engine = engine
    self._metrics = metrics
    self._interval_s = interval_s
    self._prefix = prefix
    self._last = self._totals()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._loop, name="jaxserve-stats", daemon=True)

  def _totals(self) -> TokenTotals:
    sample = lambda name: self._metrics.registry.get_sample_value(name) or 0.0
    return TokenTotals(
      sample("jaxserve_prompt_tokens_total"),
      sample("jaxserve_generation_tokens_total"),
      time.monotonic(),
    )

  def tick(self) -> str | None:
    """The line for the interval since the last tick, logged; None (and no log) when idle."""
    now, last = self._totals(), self._last
    self._last = now
    stats = self._engine.stats
    prompt, generation = now.prompt - last.prompt, now.generation - last.generation
    if not (prompt or generation or stats.num_running or stats.num_waiting):
      return None
    elapsed = max(now.time - last.time, 1e-9)
    usage = 100.0 * stats.num_used_pages / max(stats.num_total_pages, 1)
    line = (
      f"{self._prefix}Avg prompt throughput: {prompt / elapsed:.1f} tokens/s, "
      "Avg generation throughput: "
      f"{generation / elapsed:.1f} tokens/s, Running: {stats.num_running} reqs, Waiting: "
      f"{stats.num_waiting} reqs, KV cache usage: {usage:.1f}%"
    )
    logger.info("%s", line)
    return line

  def start(self) -> StatsLogger:
    if self._interval_s > 0:
      self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join(5)

  def _loop(self) -> None:
    while not self._stop.wait(self._interval_s):
      self.tick()
