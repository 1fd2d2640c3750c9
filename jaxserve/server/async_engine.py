"""The engine thread: one thread owns the LLMEngine; asyncio handlers talk to it through a queue.

* Every engine call (add_request, abort_request, step, stats) happens on the engine thread.
* Handlers put commands (add a group of requests, abort ids) into a deque guarded by a
  threading.Condition and wake the thread. The thread sleeps on the condition while it has
  neither commands nor unfinished requests, so an idle server burns no CPU.
* The requests of one HTTP call (prompts x n choices) share one OutputStream: an asyncio.Queue on
  the handler's event loop. The thread hands a step's outputs over with
  loop.call_soon_threadsafe, one call per event loop per step.
* An add is acknowledged through an asyncio future, so a handler learns of a ValueError (a prompt
  too long, an id out of vocabulary) before it sends a status line. A group is added atomically:
  if one request is refused, the ones already added are aborted.
* Commands are applied before each step, so an abort takes effect within one engine step.
* After applying commands and after each step the thread publishes an EngineStats snapshot that
  /metrics reads without touching the engine.
* Admission (server/admission.py): `waiting` counts the HTTP requests admitted and not started;
  a group's place goes back when each of its requests has delivered an output (or the group was
  aborted or failed).
* If the engine raises, the thread fails every open stream with EngineDeadError and exits;
  `alive` turns False (and /health 503).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
from dataclasses import dataclass

from jaxserve.engine.engine_stats import EngineStats
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.outputs import RequestOutput
from jaxserve.server.admission import Place, WaitingRequests
from jaxserve.core.streams import EngineDeadError, OutputStream, RequestSpec

logger = logging.getLogger(__name__)


IDLE_STATS_S = 1.0  # an idle engine thread refreshes its stats snapshot this often


@dataclass
class _Add:
  specs: list[RequestSpec]
  stream: OutputStream
  future: asyncio.Future


@dataclass
class _Abort:
  request_ids: list[str]


@dataclass
class _EndStreams:
  error: EngineDeadError


class AsyncEngine:
  """Runs an LLMEngine on its own thread and serves any number of asyncio event loops."""

  def __init__(self, engine: LLMEngine):
    self._engine = engine
    self._cond = threading.Condition()
    self._inbox: collections.deque[_Add | _Abort | _EndStreams] = collections.deque()
    self._streams: dict[str, OutputStream] = {}
    self._stats = engine.stats()
    self.waiting = WaitingRequests()
    self._stopping = False
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._run, name="jaxserve-engine", daemon=True)

  # -- lifecycle (any thread) ----------------------------------------------------------------
  def start(self) -> AsyncEngine:
    self._thread.start()
    return self

  def stop(self, timeout: float = 10.0) -> None:
    """Aborts what is left and ends the thread."""
    with self._cond:
      self._stopping = True
      self._cond.notify()
    self._thread.join(timeout)

  @property
  def alive(self) -> bool:
    return self._thread.is_alive() and not self._stopping

  @property
  def stats(self) -> EngineStats:
    """The snapshot published after the engine thread's last iteration."""
    return self._stats

  @property
  def num_http_waiting(self) -> int:
    return self.waiting.count

  @property
  def num_api_servers(self) -> int:
    return 1  # this process serves HTTP itself

  def try_admit(self, limit: int) -> Place | None:
    return self.waiting.try_admit(limit)

  async def attach(self) -> None:
    """Nothing to do: the thread serves any event loop."""

  async def detach(self) -> None:
    """Nothing to do: stop() ends the thread."""

  # -- event loop side ---------------------------------------------------------------------
  async def add(self, specs: list[RequestSpec], place: Place | None = None) -> OutputStream:
    """Queues the group on the engine; raises ValueError (naming the field) if it refuses one.
    The stream gives `place` back once every request of the group has started."""
    loop = asyncio.get_running_loop()
    stream = OutputStream(self, [s.request_id for s in specs], loop, place)
    future = loop.create_future()
    self._submit(_Add(specs, stream, future))
    return await stream.admitted(future)

  def abort(self, request_ids: list[str]) -> None:
    self._submit(_Abort(list(request_ids)))

  def end_streams(self, error: EngineDeadError) -> None:
    """Aborts every running request and ends its stream with `error` (the engine keeps
    running); the drain timeout uses it (server/drain.py)."""
    self._submit(_EndStreams(error))

  def _submit(self, command: _Add | _Abort | _EndStreams) -> None:
    with self._cond:
      if self._error is not None or self._stopping:
        raise EngineDeadError("the engine is not running")
      self._inbox.append(command)
      self._cond.notify()

  # -- the engine thread ---------------------------------------------------------------------
  def _run(self) -> None:
    try:
      while (commands := self._wait_for_work()) is not None:
        for command in commands:
          self._apply(command)
        if commands:
          self._publish_stats()
        if self._engine.has_unfinished_requests():
          self._deliver(self._engine.step())
          self._publish_stats()
    except BaseException as err:  # the engine is unusable now; tell every waiting handler
      logger.exception("engine thread failed")
      self._fail_all(err)
      return
    self._abort_all()

  def _wait_for_work(self) -> list[_Add | _Abort | _EndStreams] | None:
    with self._cond:
      while (not self._inbox and not self._stopping
             and not self._engine.has_unfinished_requests()):
        if not self._cond.wait(timeout=IDLE_STATS_S):
          self._publish_stats()  # idle stats still change: programs compiling in the background
      if self._stopping:
        return None
      commands = list(self._inbox)
      self._inbox.clear()
      return commands

  def _apply(self, command: _Add | _Abort | _EndStreams) -> None:
    if isinstance(command, _EndStreams):
      streams = set(self._streams.values())
      for request_id in list(self._streams):
        self._engine.abort_request(request_id)
      self._streams.clear()
      for stream in streams:
        _call_soon(stream.loop, stream._put, command.error)
      if streams:
        logger.warning("ended %d running response(s): %s", len(streams), command.error)
      return
    if isinstance(command, _Abort):
      for request_id in command.request_ids:
        self._engine.abort_request(request_id)
      return
    added: list[str] = []
    try:
      for spec in command.specs:
        self._engine.add_request(list(spec.prompt_token_ids), spec.params,
                                 request_id=spec.request_id, arrival_time=spec.arrival_time)
        added.append(spec.request_id)
    except ValueError as err:
      for request_id in added:
        self._engine.abort_request(request_id)
      _call_soon(command.stream.loop, _resolve, command.future, err)
      return
    for request_id in added:
      self._streams[request_id] = command.stream
    _call_soon(command.stream.loop, _resolve, command.future, None)

  def _deliver(self, outputs: list[RequestOutput]) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[OutputStream, RequestOutput]]] = {}
    for output in outputs:
      stream = (self._streams.pop(output.request_id, None) if output.finished
                else self._streams.get(output.request_id))
      if stream is not None:
        by_loop.setdefault(stream.loop, []).append((stream, output))
    for loop, items in by_loop.items():
      _call_soon(loop, _put_all, items)

  def _publish_stats(self) -> None:
    self._stats = self._engine.stats()

  def _fail_all(self, err: BaseException) -> None:
    with self._cond:
      self._error = err
      commands = list(self._inbox)
      self._inbox.clear()
    for command in commands:
      if isinstance(command, _Add):
        _call_soon(command.stream.loop, _resolve, command.future, EngineDeadError(str(err)))
    for stream in set(self._streams.values()):
      _call_soon(stream.loop, stream._put, err)
    self._streams.clear()

  def _abort_all(self) -> None:
    for request_id in list(self._streams):
      self._engine.abort_request(request_id)
    self._fail_all(EngineDeadError("the server is shutting down"))
    self._publish_stats()


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
  try:
    loop.call_soon_threadsafe(fn, *args)
  except RuntimeError:  # that event loop is closed: nobody is listening any more
    pass


def _resolve(future: asyncio.Future, err: BaseException | None) -> None:
  if future.done():
    return
  if err is None:
    future.set_result(None)
  else:
    future.set_exception(err)


def _put_all(items: list[tuple[OutputStream, RequestOutput]]) -> None:
  for stream, output in items:
    stream._put(output)


