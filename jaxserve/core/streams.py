"""What an HTTP handler gets from the engine core's client (core/client.py) for the requests it
sends (engine/core_io.py's EngineCoreRequest records): the stream of their outputs
(OutputStream) and the errors that end them.

A stream belongs to one HTTP call: its requests (prompts x n choices) share it, their outputs
arrive in step order on the serving event loop, one engine step's at a time (the client lets the
handler take them before it delivers the next step's), and abort() (the response ended, however it
ended) aborts whatever of the group is unfinished. The client refuses a group with ValueError
(a field's rule: 400), QueueFullError (server.max_waiting_requests HTTP requests wait: 429) or
EngineDeadError (the core is gone: 503).

A stream's waiting outputs are bounded: at most MAX_PENDING_PER_REQUEST outputs of each request
wait for the handler; past that a request's new output is merged into its latest waiting one
(`merge_outputs`: tokens, text and logprobs appended). A handler only falls behind while its
client reads slower than the engine generates (its writes wait on flow control), so such a
client gets bigger chunks, the same tokens, and the memory a stream holds stays a few outputs per
choice whatever the client does (each output holds its request's cumulative token ids). A client
that reads nothing is cut after server.stream_stall_timeout_s (server/http_protocol.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from jaxserve.api.outputs import RequestOutput, merge_outputs

MAX_PENDING_PER_REQUEST = 8


class EngineDeadError(RuntimeError):
  """The engine core has stopped or is unreachable; no request can make progress."""


class QueueFullError(RuntimeError):
  """The core refused a group: `limit` HTTP requests are already waiting to start."""

  def __init__(self, limit: int):
    super().__init__(f"{limit} requests are waiting")
    self.limit = limit


class OutputStream:
  """The outputs of a group of engine requests, in step order, delivered on one event loop.
  `abort` is the client's: it aborts request ids in the engine core; engine_index: the core
  serving them (vLLM's `engine` label of their metrics)."""

  def __init__(
    self, abort: Callable[[list[str]], None], request_ids: list[str], engine_index: int = 0
  ):
    self.request_ids = tuple(request_ids)
    self.engine_index = engine_index
    self._abort = abort
    self._items: deque[RequestOutput | BaseException] = deque()
    self._pending: dict[str, int] = {}  # request id -> its outputs in _items
    self._waiter: asyncio.Future | None = None
    self._unfinished = set(request_ids)
    self.num_merged = 0  # outputs merged into a waiting one (the handler fell behind)

  @property
  def finished(self) -> bool:
    return not self._unfinished

  async def get(self) -> RequestOutput:
    """The next output of any request of the group; raises EngineDeadError if the engine died."""
    while not self._items:
      self._waiter = asyncio.get_running_loop().create_future()
      try:
        await self._waiter
      finally:
        self._waiter = None
    item = self._items.popleft()
    if isinstance(item, BaseException):
      self._unfinished.clear()
      if isinstance(item, EngineDeadError):
        raise item
      raise EngineDeadError(f"the engine stopped: {item}")
    self._pending[item.request_id] -= 1
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
    if isinstance(item, RequestOutput):
      waiting = self._pending.get(item.request_id, 0)
      if waiting >= MAX_PENDING_PER_REQUEST and self._merge(item):
        return
      self._pending[item.request_id] = waiting + 1
    self._items.append(item)
    if self._waiter is not None and not self._waiter.done():
      self._waiter.set_result(None)

  def _merge(self, output: RequestOutput) -> bool:
    """Merges `output` into its request's latest waiting output (False if none waits)."""
    items = self._items
    for i in range(len(items) - 1, -1, -1):
      earlier = items[i]
      if isinstance(earlier, RequestOutput) and earlier.request_id == output.request_id:
        items[i] = merge_outputs(earlier, output)
        self.num_merged += 1
        return True
    return False


def now() -> float:
  """The engine's clock (arrival times are compared with its step times; CLOCK_MONOTONIC is the
  same in every process of the machine)."""
  return time.monotonic()
