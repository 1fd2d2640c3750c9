"""CoreClient: an API server process's side of the engine core (core/loop.py).

Everything runs on the serving event loop, no thread: attach() (uvicorn's lifespan) connects a
DEALER socket (zmq.asyncio) under this process's identity, says Hello, waits for the core's
first stats and starts two tasks; detach() says goodbye (ClientGone), so the core aborts
whatever this client left running. The receiver
decodes each StepOutputs, answers the adds it carries, runs the OutputProcessor (engine/
output_processor.py: detokenization, stop strings, RequestOutputs; the same code the in-process
engine runs) and puts each RequestOutput in its OutputStream; a request a stop string ended is
aborted in the core (AbortRequests stopped=True). The watcher follows the socket's monitor: when
the core's end of the connection closes (the process died, even by SIGKILL) or the core sent
CoreFailed, every open stream and pending add fails with EngineDeadError (an error event and
[DONE] on a stream) and `alive` turns False (/health 503).
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from jaxserve.engine.admission import ContextLengthError
from jaxserve.core.messages import (AbortRequests, AddRequests, AddResult, ClientGone,
                                           CoreFailed,
                                           EngineCoreRequest, FromCore, Hello, StepOutputs)
from jaxserve.engine.engine_stats import EngineStats
from jaxserve.engine.output_processor import OutputProcessor
from jaxserve.server.admission import Place
from jaxserve.core.streams import EngineDeadError, OutputStream, RequestSpec
from jaxserve.server.errors import queue_full
from jaxserve.tokenizer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 30.0


def _zero_stats() -> EngineStats:
  return EngineStats(**{f.name: 0 for f in dataclasses.fields(EngineStats)
                        if f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING})


class CoreClient:
  """An EngineClient (core/streams.py) over the engine core process at `address`."""

  def __init__(self, address: str, tokenizer: Tokenizer, identity: str | None = None,
               connect_timeout_s: float = CONNECT_TIMEOUT_S):
    self._address = address
    self._connect_timeout_s = connect_timeout_s
    self._identity = (identity or f"api-{os.getpid()}-{id(self):x}").encode()
    self._processor = OutputProcessor(tokenizer)
    self._encoder = msgspec.msgpack.Encoder()
    self._decoder = msgspec.msgpack.Decoder(FromCore)
    self._streams: dict[str, OutputStream] = {}
    self._adds: dict[int, tuple[asyncio.Future, list[str], int]] = {}
    self._groups = itertools.count()
    self._stats = _zero_stats()  # until the core's first message
    self._num_http_waiting = 0
    self._num_api_servers = 0
    self._error: str | None = None
    self._attached = False
    self._loop: asyncio.AbstractEventLoop | None = None
    self._context: zmq.asyncio.Context | None = None
    self._socket: zmq.asyncio.Socket | None = None
    self._tasks: list[asyncio.Task] = []

  # -- EngineClient ----------------------------------------------------------------------------
  @property
  def alive(self) -> bool:
    return self._attached and self._error is None

  @property
  def stats(self) -> EngineStats:
    return self._stats

  @property
  def num_http_waiting(self) -> int:
    return self._num_http_waiting

  @property
  def num_api_servers(self) -> int:
    return self._num_api_servers

  def try_admit(self, limit: int) -> Place | None:
    return Place(None, limit)  # the core counts, when add() sends the group

  async def add(self, specs: list[RequestSpec], place: Place | None = None) -> OutputStream:
    if not self.alive:
      raise EngineDeadError(self._error or "the engine core is not connected")
    loop = asyncio.get_running_loop()
    request_ids = [s.request_id for s in specs]
    stream = OutputStream(self, request_ids, loop, None)
    group, future = next(self._groups), loop.create_future()
    limit = place.limit if place is not None else 2**31 - 1
    self._adds[group] = (future, request_ids, limit)
    for spec in specs:
      self._processor.add_request(spec.request_id, spec.prompt_token_ids, spec.params,
                                  spec.arrival_time)
      self._streams[spec.request_id] = stream
    self._send(AddRequests(group, [
        EngineCoreRequest(s.request_id, list(s.prompt_token_ids), s.params, s.arrival_time)
        for s in specs], limit))
    return await stream.admitted(future)

  def abort(self, request_ids: list[str]) -> None:
    for request_id in request_ids:
      self._streams.pop(request_id, None)
      self._processor.remove(request_id)
    if self.alive and request_ids:
      self._send(AbortRequests(list(request_ids)))

  def end_streams(self, error: EngineDeadError) -> None:
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
    self._socket.setsockopt(zmq.SNDHWM, 0)  # never drop or refuse a message (see core_process)
    self._socket.setsockopt(zmq.RCVHWM, 0)
    monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    self._socket.connect(self._address)
    self._send(Hello())
    self._attached = True
    try:
      first = await asyncio.wait_for(self._socket.recv(), self._connect_timeout_s)
    except asyncio.TimeoutError:
      self._fail(f"the engine core at {self._address} did not answer")
      monitor.close()
      return
    self._receive_message(self._decoder.decode(first))
    self._tasks = [asyncio.ensure_future(self._receive()),
                   asyncio.ensure_future(self._watch(monitor))]

  async def detach(self) -> None:
    for task in self._tasks:
      task.cancel()
    await asyncio.gather(*self._tasks, return_exceptions=True)
    if self._socket is not None and self._error is None:
      self._send(ClientGone(self._identity.decode()))  # the core aborts what is left
      self._socket.setsockopt(zmq.LINGER, 1000)
    self._attached = False
    if self._socket is not None:
      self._socket.disable_monitor()
      self._socket.close()
      self._context.term()

  # -- the event loop's tasks ------------------------------------------------------------------
  async def _receive(self) -> None:
    try:
      while self._error is None:
        self._receive_message(self._decoder.decode(await self._socket.recv()))
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
      monitor.close()

  def _receive_message(self, message: StepOutputs | CoreFailed) -> None:
    if isinstance(message, CoreFailed):
      self._fail(message.error)
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
      stream = streams.pop(output.request_id, None) if output.finished else streams.get(
          output.request_id)
      if stream is not None:
        stream._put(output)

  def _answer(self, answer: AddResult) -> None:
    future, request_ids, limit = self._adds.pop(answer.group)
    error, full = answer.error, answer.queue_full
    if error is not None or full:
      for request_id in request_ids:
        self._streams.pop(request_id, None)
        self._processor.remove(request_id)
    if future.done():  # the handler was cancelled: its stream aborted the requests
      return
    if full:
      future.set_exception(queue_full(limit))
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
    for stream in set(self._streams.values()):
      stream._put(EngineDeadError(reason))
    self._streams.clear()

  def _send(self, message: Hello | AddRequests | AbortRequests | ClientGone) -> None:
    self._socket.send(self._encoder.encode(message), copy=False)
