"""What an HTTP handler gets from the engine core's client (core/client.py): the request it
sends (RequestSpec), the stream of its outputs (OutputStream) and the errors that end them.

A stream belongs to one HTTP call: its requests (prompts x n choices) share it, their outputs
arrive in step order on the serving event loop, one engine step's at a time (the client lets the
handler take them before it delivers the next step's), and abort() (the response ended, however it
ended) aborts whatever of the group is unfinished. The client refuses a group with ValueError
(a field's rule: 400), QueueFullError (server.max_waiting_requests HTTP requests wait: 429) or
EngineDeadError (the core is gone: 503).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from jaxserve.outputs import RequestOutput
from jaxserve.sampling_params import SamplingParams


class EngineDeadError(RuntimeError):
  """The engine core has stopped or is unreachable; no request can make progress."""


class QueueFullError(RuntimeError):
  """The core refused a group: `limit` HTTP requests are already waiting to start."""

  def __init__(self, limit: int):
    super().__init__(f"{limit} requests are waiting")
    self.limit = limit


@dataclass(frozen=True)
class RequestSpec:
  """One engine request: already tokenized, with its sampling parameters."""

  request_id: str
  prompt_token_ids: tuple[int, ...]
  params: SamplingParams
  arrival_time: float


class OutputStream:
  """The outputs of a group of engine requests, in step order, delivered on one event loop.
  `abort` is the client's: it aborts request ids in the engine core."""

  def __init__(self, abort: Callable[[list[str]], None], request_ids: list[str]):
    self.request_ids = tuple(request_ids)
    self._abort = abort
    self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
    self._unfinished = set(request_ids)

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

  async def admitted(self, future: asyncio.Future) -> OutputStream:
    """This stream once `future` (the core accepting the group) resolves; the group is aborted
    if the caller is cancelled while waiting, and the core's refusal propagates."""
    try:
      await future
    except asyncio.CancelledError:
      self.abort()
      raise
    return self

  def abort(self) -> int:
    """Aborts the group's unfinished requests and returns how many (0 once all finished)."""
    count = len(self._unfinished)
    if count:
      self._abort(sorted(self._unfinished))
      self._unfinished.clear()
    return count

  def _put(self, item: RequestOutput | BaseException) -> None:
    self._queue.put_nowait(item)


def now() -> float:
  """The engine's clock (arrival times are compared with its step times; CLOCK_MONOTONIC is the
  same in every process of the machine)."""
  return time.monotonic()
