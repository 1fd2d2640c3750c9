"""CoreClient: an API server's side of the engine core (core/loop.py), what the HTTP handlers
talk to, whether the core runs in its own process (core/process.py) or on a thread of this one
(core/in_process.py): the same ZeroMQ traffic either way.

Everything runs on the serving event loop, no thread: attach() (uvicorn's lifespan) connects a
DEALER socket (zmq.asyncio) under this client's identity, says Hello, waits for the core's
first stats and starts two tasks; detach() says goodbye (ClientGone), so the core aborts
whatever this client left running. add() sends one HTTP call's requests with the admission
limit (server.max_waiting_requests), which the core alone counts (core/loop.py); its answer
resolves the add: accepted, ValueError naming the field, or QueueFullError (429). The receiver
decodes each StepOutputs, answers the adds it carries, runs the OutputProcessor (engine/
output_processor.py: detokenization, stop strings, RequestOutputs; the same code LLM.generate
runs) and puts each RequestOutput in its OutputStream; a request a stop string ended is
aborted in the core (AbortRequests stopped=True). The watcher follows the socket's monitor: when
the core's end of the connection closes (the process died, even by SIGKILL) or the core sent
CoreFailed, every open stream and pending add fails with EngineDeadError (an error event and
[DONE] on a stream) and `alive` turns False (/health 503).

Several engine cores (data_parallel_size > 1): an API server holds one CoreClient per core
(core/dp_client.py), each with its engine_index (its streams carry it, for vLLM's `engine`
label); load() is what the router reads of it: the core's reported waiting + running requests
plus this client's requests whose add is not answered yet (counted once per API server process),
and its KV use.

Sleep mode: sleep(), wake_up() and is_sleeping() send Sleep / WakeUp / IsSleeping and wait for
the core's ControlDone of that call (a refusal raises ValueError naming the field; a core that
dies fails them with EngineDeadError, as it fails the adds).

One step at a time: after each StepOutputs the receiver yields to the event loop before it takes
the next, so the handlers its outputs woke write their chunks first: one SSE chunk per step and
stream, written before the next step's tokens reach the stream. zmq.asyncio's recv() returns a
waiting message without suspending, so a receiver that fell behind (its loop busy for longer
than a step) would otherwise take every queued message at once and each stream would send
several steps' chunks back to back. The yield costs one event loop pass per step, not per chunk.
A stream whose client reads slowly (its writes wait on flow control) still gets its outputs
queued, one per step.

The receiver does not trust one wake-up: zmq.asyncio wakes a waiting recv() from the socket's
edge-triggered file descriptor, and a wake-up missed under load would leave the message (and
every stream and add of this API server) waiting for the core's next one, for ever on a core that
has nothing else to send. It takes a waiting message without waiting, and when none is there it
polls with a timeout (RECEIVE_POLL_MS) and asks again, so a missed wake-up costs at most one
period.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from jaxserve.core.dp_routing import CoreLoad, core_load
from jaxserve.core.messages import (
  AbortRequests,
  AddRequests,
  AddResult,
  ClientGone,
  ControlCall,
  ControlDone,
  CoreFailed,
  EngineCoreRequest,
  FromCore,
  Hello,
  IsSleeping,
  Sleep,
  StepOutputs,
  WakeUp,
)
from jaxserve.core.streams import EngineDeadError, OutputStream, QueueFullError
from jaxserve.engine.admission import ContextLengthError
from jaxserve.engine.engine_stats import EngineStats
from jaxserve.engine.output_processor import OutputProcessor
from jaxserve.tokenizer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 30.0
RECEIVE_POLL_MS = 100  # the receiver's longest wait before it asks the socket itself


async def next_message(socket: zmq.asyncio.Socket, poll_ms: int = RECEIVE_POLL_MS) -> bytes:
  """The socket's next message, looking at the socket's own state at least every `poll_ms`
  (a missed wake-up of its file descriptor costs one period: the module docstring)."""
  while True:
    try:
      return await socket.recv(zmq.NOBLOCK)  # one waiting: taken at once, nothing registered
    except zmq.Again:
      await socket.poll(poll_ms, zmq.POLLIN)  # none: wait for one, or for the period


@dataclass(frozen=True)
class CoreState:
  """One engine core as /metrics and /health see it: its index, whether its client is
  connected, its last stats."""

  index: int
  alive: bool
  stats: EngineStats


def _zero_stats() -> EngineStats:
  return EngineStats(
    **{
      f.name: 0
      for f in dataclasses.fields(EngineStats)
      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
  )


class CoreClient:
  """The engine core at `address` (a bound ROUTER socket running CoreLoop), for one event loop."""

  def __init__(
    self,
    address: str,
    tokenizer: Tokenizer,
    identity: str | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    engine_index: int = 0,
  ):
    self.engine_index = engine_index  # vLLM's `engine` label; its streams carry it
    self._address = address
    self._connect_timeout_s = connect_timeout_s
    self._identity = (identity or f"api-{os.getpid()}-{id(self):x}").encode()
    self._processor = OutputProcessor(tokenizer)
    self._encoder = msgspec.msgpack.Encoder()
    self._decoder = msgspec.msgpack.Decoder(FromCore)
    self._streams: dict[str, OutputStream] = {}
    self._adds: dict[int, tuple[asyncio.Future, list[str], int]] = {}
    self._num_unanswered = 0  # requests of the adds in self._adds
    self._groups = itertools.count()
    self._calls: dict[int, asyncio.Future] = {}  # sleep-mode calls waiting for ControlDone
    self._stats = _zero_stats()  # until the core's first message
    self._num_http_waiting = 0
    self._num_api_servers = 0
    self._error: str | None = None
    self._attached = False
    self._loop: asyncio.AbstractEventLoop | None = None
    self._context: zmq.asyncio.Context | None = None
    self._socket: zmq.asyncio.Socket | None = None
    self._monitor: zmq.asyncio.Socket | None = None  # the socket's monitor (_close_monitor)
    self._tasks: list[asyncio.Task] = []

  # -- what the handlers use ------------------------------------------------------------------
  @property
  def alive(self) -> bool:
    return self._attached and self._error is None

  @property
  def degraded(self) -> bool:
    """One core is alive or not: never degraded (DataParallelClient's may be)."""
    return False

  @property
  def stats(self) -> EngineStats:
    """The core's last published snapshot."""
    return self._stats

  @property
  def num_http_waiting(self) -> int:
    """HTTP requests admitted and not started, over every client of the core (the core's
    count, which server.max_waiting_requests bounds)."""
    return self._num_http_waiting

  @property
  def num_api_servers(self) -> int:
    """Clients (API servers) connected to the core."""
    return self._num_api_servers

  def core_states(self) -> list[CoreState]:
    """This one core's state (DataParallelClient lists each of its cores')."""
    return [CoreState(self.engine_index, self.alive, self._stats)]

  def load(self) -> CoreLoad:
    """The core's load as the router reads it (core/dp_routing.core_load): reported waiting +
    running requests, this client's unanswered adds once per API server, and its KV use."""
    stats = self._stats
    usage = stats.num_used_pages / stats.num_total_pages if stats.num_total_pages else 0.0
    reported = stats.num_waiting + stats.num_running
    return core_load(self.alive, reported, self._num_unanswered, self._num_api_servers, usage)

  async def add(self, requests: list[EngineCoreRequest], max_waiting: int) -> OutputStream:
    """Sends one HTTP call's requests as they are, which the core adds all or none; the stream
    once the core accepted them. Raises ValueError (naming the field) if it refused one,
    QueueFullError if `max_waiting` HTTP requests were waiting, EngineDeadError if the core is
    gone."""
    if not self.alive:
      raise EngineDeadError(self._error or "the engine core is not connected")
    loop = asyncio.get_running_loop()
    request_ids = [r.request_id for r in requests]
    stream = OutputStream(self.abort, request_ids, self.engine_index)
    group, future = next(self._groups), loop.create_future()
    self._adds[group] = (future, request_ids, max_waiting)
    self._num_unanswered += len(request_ids)
    for request in requests:
      self._processor.add_request(request)
      self._streams[request.request_id] = stream
    self._send(AddRequests(group, requests, max_waiting))
    return await stream.admitted(future)

  async def sleep(self, level: int, mode: str = "abort") -> None:
    """The core sleeps (engine/sleep_mode.py); ValueError naming the field if it refused."""
    await self._call(lambda call: Sleep(call, level, mode))

  async def wake_up(self, tags: list[str] | None = None) -> None:
    await self._call(lambda call: WakeUp(call, tags))

  async def is_sleeping(self) -> bool:
    return (await self._call(IsSleeping)).is_sleeping

  async def _call(self, make: Callable[[int], ControlCall]) -> ControlDone:
    if not self.alive:
      raise EngineDeadError(self._error or "the engine core is not connected")
    call = next(self._groups)
    future = self._calls[call] = asyncio.get_running_loop().create_future()
    self._send(make(call))
    try:
      done: ControlDone = await future
    finally:
      self._calls.pop(call, None)
    if done.error is not None:
      raise ValueError(done.error)
    return done

  def abort(self, request_ids: list[str]) -> None:
    for request_id in request_ids:
      self._streams.pop(request_id, None)
      self._processor.remove(request_id)
    if self.alive and request_ids:
      self._send(AbortRequests(list(request_ids)))

  def end_streams(self, error: EngineDeadError) -> None:
    """Ends every open stream with `error` and aborts its requests (any thread; the drain
    timeout uses it, server/drain.py)."""
    if self._loop is None:
      return
    try:
      self._loop.call_soon_threadsafe(self._end_streams, error)
    except RuntimeError:  # the loop has closed: nothing is streaming
      pass

  async def attach(self) -> None:
    """Connects and waits for the core's first stats; a core that does not answer in time
    leaves the client failed (/health 503, requests 503)."""
    self._loop = asyncio.get_running_loop()
    self._context = zmq.asyncio.Context()
    self._socket = self._context.socket(zmq.DEALER)
    self._socket.setsockopt(zmq.IDENTITY, self._identity)
    self._socket.setsockopt(zmq.LINGER, 0)
    self._socket.setsockopt(zmq.SNDHWM, 0)  # never drop or refuse a message (core/router.py)
    self._socket.setsockopt(zmq.RCVHWM, 0)
    monitor = self._monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    self._socket.connect(self._address)
    self._send(Hello())
    self._attached = True
    try:
      first = await asyncio.wait_for(self._socket.recv(), self._connect_timeout_s)
    except asyncio.TimeoutError:
      self._fail(f"the engine core at {self._address} did not answer")
      self._close_monitor()
      return
    self._receive_message(self._decoder.decode(first))
    self._tasks = [
      asyncio.ensure_future(self._receive()),
      asyncio.ensure_future(self._watch(monitor)),
    ]

  async def detach(self) -> None:
    for task in self._tasks:
      task.cancel()
    await asyncio.gather(*self._tasks, return_exceptions=True)
    if self._socket is not None and self._error is None:
      self._send(ClientGone(self._identity.decode()))  # the core aborts what is left
      self._socket.setsockopt(zmq.LINGER, 1000)
    self._attached = False
    if self._socket is not None:
      self._close_monitor()  # the watcher's finally did, unless it never ran
      self._socket.close()
      self._context.term()

  def _close_monitor(self) -> None:
    """Stops the socket's monitor, then closes the monitor's socket (once). In this order only:
    libzmq's I/O thread sends each event (the core's end closing) to the monitor's PAIR socket
    with a blocking send, holding the socket's monitor lock; once that PAIR is closed such a send
    blocks for ever, and so would disable_monitor() (holding the GIL) and close() after it: a
    core that exits on this client's ClientGone would hang detach()."""
    if self._monitor is None:
      return
    self._socket.disable_monitor()
    self._monitor.close()
    self._monitor = None

  # -- the event loop's tasks ------------------------------------------------------------------
  async def _receive(self) -> None:
    try:
      while self._error is None:
        self._receive_message(self._decoder.decode(await next_message(self._socket)))
        await asyncio.sleep(0)  # the handlers this step woke write before the next step
    except asyncio.CancelledError:
      raise
    except Exception as err:  # a bad message: nothing can be trusted any more
      logger.exception("engine core client failed")
      self._fail(f"the engine core connection failed: {err}")

  async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
    try:
      while True:
        event = parse_monitor_message(await monitor.recv_multipart())
        if event["event"] == zmq.EVENT_DISCONNECTED:
          self._fail("the engine core process stopped")
          return
    finally:
      self._close_monitor()

  def _receive_message(self, message: StepOutputs | CoreFailed | ControlDone) -> None:
    if isinstance(message, CoreFailed):
      self._fail(message.error)
      return
    if isinstance(message, ControlDone):
      future = self._calls.get(message.call)
      if future is not None and not future.done():
        future.set_result(message)
      return
    self._stats, self._num_http_waiting = message.stats, message.num_http_waiting
    self._num_api_servers = message.num_api_servers
    for answer in message.added:
      self._answer(answer)
    if not message.outputs:
      return
    outputs, stopped = self._processor.process(message.outputs)
    if stopped:
      self._send(AbortRequests(stopped, stopped=True))
    streams = self._streams
    for output in outputs:
      stream = (
        streams.pop(output.request_id, None) if output.finished else streams.get(output.request_id)
      )
      if stream is not None:
        stream._put(output)

  def _answer(self, answer: AddResult) -> None:
    future, request_ids, limit = self._adds.pop(answer.group)
    self._num_unanswered -= len(request_ids)
    error, full = answer.error, answer.queue_full
    if error is not None or full:
      for request_id in request_ids:
        self._streams.pop(request_id, None)
        self._processor.remove(request_id)
    if future.done():  # the handler was cancelled: its stream aborted the requests
      return
    if full:
      future.set_exception(QueueFullError(limit))
    elif error is not None:
      kind = ContextLengthError if answer.context_length else ValueError
      future.set_exception(kind(error))
    else:
      future.set_result(None)

  def _end_streams(self, error: EngineDeadError) -> None:
    streams = set(self._streams.values())
    self.abort(list(self._streams))
    for stream in streams:
      stream._put(error)
    if streams:
      logger.warning("ended %d running response(s): %s", len(streams), error)

  def _fail(self, reason: str) -> None:
    if self._error is not None:
      return
    self._error = reason
    logger.error("%s: failing %d open request(s)", reason, len(self._streams))
    for future, _, _ in self._adds.values():
      if not future.done():
        future.set_exception(EngineDeadError(reason))
    self._adds.clear()
    for future in self._calls.values():
      if not future.done():
        future.set_exception(EngineDeadError(reason))
    self._num_unanswered = 0
    for stream in set(self._streams.values()):
      stream._put(EngineDeadError(reason))
    self._streams.clear()

  def _send(self, message: Hello | AddRequests | AbortRequests | ClientGone | ControlCall) -> None:
    self._socket.send(self._encoder.encode(message), copy=False)
