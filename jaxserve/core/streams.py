"""What the HTTP handlers talk to: the EngineClient protocol and the streams it hands out.

Two implementations: AsyncEngine (server/async_engine.py: the engine on a thread of the serving
process, `server.api_server_count: 0`) and CoreClient (core/client.py: the engine core in
its own process, reached over ZeroMQ; the default of `jaxserve serve`). The handlers, the drain
and the metrics see only this protocol.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

from jaxserve.engine.engine_stats import EngineStats
from jaxserve.outputs import RequestOutput
from jaxserve.sampling_params import SamplingParams
from jaxserve.server.admission import Place


class EngineClient(Protocol):
  @property
  def alive(self) -> bool: ...

  @property
  def stats(self) -> EngineStats:
    """The engine's last published snapshot."""

  @property
  def num_http_waiting(self) -> int:
    """HTTP requests admitted and not started (server.max_waiting_requests bounds it)."""

  @property
  def num_api_servers(self) -> int:
    """HTTP server processes connected to the engine (1 for the single-process server)."""

  def try_admit(self, limit: int) -> Place | None:
    """A place among the waiting requests, or None when `limit` wait (checked here or, for
    CoreClient, by the core when add() sends the group)."""

  async def add(self, specs: list[RequestSpec], place: Place | None = None) -> OutputStream:
    """Queues one HTTP call's requests; ValueError (naming the field) if one is refused."""

  def abort(self, request_ids: list[str]) -> None: ...

  def end_streams(self, error: EngineDeadError) -> None:
    """Ends every open stream with `error` and aborts its requests (any thread)."""

  async def attach(self) -> None:
    """Called on the serving event loop before it serves (uvicorn's lifespan)."""

  async def detach(self) -> None: ...


class EngineDeadError(RuntimeError):
  """The engine thread has stopped; no request can make progress."""


@dataclass(frozen=True)
class RequestSpec:
  """One engine request: already tokenized, with its sampling parameters."""
  request_id: str
  prompt_token_ids: tuple[int, ...]
  params: SamplingParams
  arrival_time: float


class OutputStream:
  """The outputs of a group of engine requests, in step order, delivered on one event loop."""

  def __init__(self, engine: EngineClient, request_ids: list[str],
               loop: asyncio.AbstractEventLoop, place: Place | None = None):
    self.request_ids = tuple(request_ids)
    self.loop = loop
    self._engine = engine
    self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
    self._unfinished = set(request_ids)
    self._place = place
    self._not_started = set(request_ids) if place is not None else set()

  @property
  def finished(self) -> bool:
    return not self._unfinished

  async def get(self) -> RequestOutput:
    """The next output of any request of the group; raises EngineDeadError if the engine died."""
    item = await self._queue.get()
    if isinstance(item, BaseException):
      self._unfinished.clear()
      if isinstance(item, EngineDeadError):
        raise item
      raise EngineDeadError(f"the engine stopped: {item}")
    if item.finished:
      self._unfinished.discard(item.request_id)
    return item

  async def admitted(self, future: asyncio.Future) -> "OutputStream":
    """This stream once `future` (the engine accepting the group) resolves; the group is aborted
    if the caller is cancelled while waiting, and the engine's refusal (ValueError) propagates."""
    try:
      await future
    except asyncio.CancelledError:
      self.abort()
      raise
    return self

  def abort(self) -> int:
    """Aborts the group's unfinished requests and returns how many (0 once all finished)."""
    self._release_place()
    count = len(self._unfinished)
    if count:
      self._engine.abort(sorted(self._unfinished))
      self._unfinished.clear()
    return count

  def _put(self, item: RequestOutput | BaseException) -> None:
    if self._place is not None:
      if isinstance(item, BaseException):
        self._release_place()
      else:
        self._not_started.discard(item.request_id)
        if not self._not_started:
          self._release_place()
    self._queue.put_nowait(item)

  def _release_place(self) -> None:
    if self._place is not None:
      self._place.release()
      self._place = None


def now() -> float:
  """The engine's clock (arrival times are compared with its step times; CLOCK_MONOTONIC is the
  same in every process of the machine)."""
  return time.monotonic()
