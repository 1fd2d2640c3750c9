"""DataParallelClient: an API server's side of data_parallel_size engine cores, with
CoreClient's surface (what the HTTP handlers, /health, /metrics and the drain use), so the server
serves one core or several the same way (EngineClient is either).

It holds one CoreClient per core (engine_index i: core i's), all on the serving event loop.
add() asks the PrefixAffinityRouter (core/dp_routing.py, the routing rule) for a core from every
core's load and the call's first prompt, and hands the call to that core's client; the stream it
returns aborts through that client, so aborts and stop strings reach the core that runs the
requests. A core that dies fails its own streams and adds (CoreClient: an error event and [DONE]
on each stream) and is never chosen again; the others keep serving. `alive` holds while any core
is; `degraded` once some, not all, are gone (/health). The drain's end_streams ends every core's.
Sleep mode: sleep and wake_up go to every live core; is_sleeping is true while any sleeps.

Stats: `stats` sums every core's EngineStats (the jaxserve_* gauges and counters, the stats
line); a dead core's gauges (requests, KV pages) count 0, its counters keep their last value so
a counter never goes back; core_states() gives each core's (vLLM's families carry the `engine`
label). num_http_waiting sums the cores' counts (server.max_waiting_requests bounds each core's);
num_api_servers is the fewest that any live core has connected (an API server counts once every
core has its Hello).
"""

from __future__ import annotations

import asyncio
import dataclasses

from jaxserve.core.client import CoreClient, CoreState
from jaxserve.core.dp_routing import PrefixAffinityRouter
from jaxserve.core.streams import EngineDeadError, OutputStream
from jaxserve.engine.core_io import EngineCoreRequest
from jaxserve.engine.engine_stats import EngineStats

GAUGES = (
  "num_running",
  "num_waiting",
  "num_used_pages",
  "num_total_pages",
  "device_bytes_in_use",
  "num_sleeping",
)


def sum_stats(stats: list[EngineStats]) -> EngineStats:
  """Field by field (every EngineStats field is a count)."""
  names = [f.name for f in dataclasses.fields(EngineStats)]
  return EngineStats(**{name: sum(getattr(s, name) for s in stats) for name in names})


def without_gauges(stats: EngineStats) -> EngineStats:
  """A dead core's stats: its counters as last reported, nothing running or held."""
  return dataclasses.replace(stats, **{name: 0 for name in GAUGES})


class DataParallelClient:
  """The API server's clients of every engine core, routed by PrefixAffinityRouter."""

  def __init__(self, clients: list[CoreClient], page_size: int):
    self._clients = clients
    self._router = PrefixAffinityRouter(page_size)

  @property
  def clients(self) -> list[CoreClient]:
    return self._clients

  @property
  def alive(self) -> bool:
    return any(c.alive for c in self._clients)

  @property
  def degraded(self) -> bool:
    """Some engine cores are gone, not all."""
    return self.alive and not all(c.alive for c in self._clients)

  def core_states(self) -> list[CoreState]:
    return [
      CoreState(c.engine_index, c.alive, c.stats if c.alive else without_gauges(c.stats))
      for c in self._clients
    ]

  @property
  def stats(self) -> EngineStats:
    return sum_stats([state.stats for state in self.core_states()])

  @property
  def num_http_waiting(self) -> int:
    return sum(c.num_http_waiting for c in self._clients if c.alive)

  @property
  def num_api_servers(self) -> int:
    return min((c.num_api_servers for c in self._clients if c.alive), default=0)

  async def add(self, requests: list[EngineCoreRequest], max_waiting: int) -> OutputStream:
    """CoreClient.add on the core the router chooses; EngineDeadError when every core is gone."""
    index = self._router.choose(requests[0].prompt_token_ids, [c.load() for c in self._clients])
    if index is None:
      raise EngineDeadError("every engine core has stopped")
    return await self._clients[index].add(requests, max_waiting)

  async def sleep(self, level: int, mode: str = "abort") -> None:
    """Every live core sleeps."""
    await asyncio.gather(*(c.sleep(level, mode) for c in self._clients if c.alive))

  async def wake_up(self, tags: list[str] | None = None) -> None:
    await asyncio.gather(*(c.wake_up(tags) for c in self._clients if c.alive))

  async def is_sleeping(self) -> bool:
    """Whether any live core sleeps."""
    states = await asyncio.gather(*(c.is_sleeping() for c in self._clients if c.alive))
    return any(states)

  def end_streams(self, error: EngineDeadError) -> None:
    for client in self._clients:
      client.end_streams(error)

  async def attach(self) -> None:
    await asyncio.gather(*(c.attach() for c in self._clients))

  async def detach(self) -> None:
    await asyncio.gather(*(c.detach() for c in self._clients))


EngineClient = CoreClient | DataParallelClient  # what the HTTP server talks to
