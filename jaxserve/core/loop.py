"""The engine core's loop: requests in, one message of token outputs out per step. It runs in
the engine core process (core/process.py) or, for the one-process server, on a thread of the
serving process (core/in_process.py); its clients (core/client.py) cannot tell.

No asyncio: one ROUTER socket (pyzmq) that every API server's DEALER connects to, each under its
own identity. Each iteration takes every message waiting (without blocking while requests run;
idle, it sleeps in poll), applies the adds and aborts, runs one EngineCore.step() and sends each
client ONE StepOutputs: its requests' EngineCoreOutputs, the answers to its adds, and the
EngineStats snapshot (sent to every client whenever it changed, so /metrics and /health stay
current in every process). No text, no JSON: the clients detokenize.

Clients: a client's Hello registers it (it gets the stats at once). ClientGone (a client's
goodbye, or the supervisor's word that an API server process died: libzmq's stable API does not
say which peer a closed connection was) aborts every request that client owned, so no KV page
leaks and the other clients keep their requests. Stopping: `stop` ends the loop after its step;
`drain` (the engine core process's SIGTERM, core/process.py) ends it once no client is left, so
API servers still draining their streams keep their core until they have gone.

Sleep mode (engine/sleep_mode.py): Sleep, WakeUp and IsSleeping are applied as they are read,
between steps (no step is in flight then but the one sleep completes), and each is answered by a
ControlDone after that iteration's StepOutputs, so the outputs of the requests a sleep aborted
reach their clients first. While the engine sleeps the loop runs no step (EngineCore.can_step)
and idles in poll; the requests added meanwhile wait in the engine's queue until it wakes.

Admission (server.max_waiting_requests) is counted here and nowhere else, for all clients at once:
`_not_started` holds the HTTP requests (groups) admitted and not started. A group (one HTTP call,
whatever its `n` or number of prompts) takes one place when it is added and gives it back once each
of its requests has produced an output, finished or been aborted; an add that finds `max_waiting`
(the sending server's limit) groups waiting is refused (queue_full: 429), once its requests pass the
core's checks (a request that can never be served is a 400 however full the queue is). A burst of
fewer requests than the limit is never refused, as the count can never exceed the requests in
flight, and N API servers share one limit exactly. The engine's own waiting queue counts choices,
not HTTP requests, so it is not this count (docs/DECISIONS.md, "One count of waiting HTTP requests,
in the core loop").
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

import msgspec
import zmq

from jaxserve.core.messages import (
  AbortRequests,
  AddRequests,
  AddResult,
  ClientGone,
  ControlCall,
  ControlDone,
  CoreFailed,
  EngineCoreOutput,
  Hello,
  IsSleeping,
  Sleep,
  StepOutputs,
  ToCore,
  WakeUp,
)
from jaxserve.engine.admission import ContextLengthError
from jaxserve.engine.engine_core import EngineCore

logger = logging.getLogger(__name__)
IDLE_POLL_MS = 100  # how often an idle core looks at its stop flag


class CoreLoop:
  """Serves an EngineCore to the clients of a bound ROUTER socket until stop is set."""

  def __init__(self, core: EngineCore, socket: zmq.Socket):
    self._core = core
    self._socket = socket
    self._encoder = msgspec.msgpack.Encoder()
    self._decoder = msgspec.msgpack.Decoder(ToCore)
    self._clients: dict[bytes, set[str]] = {}  # identity -> its unfinished request ids
    self._owner: dict[str, bytes] = {}  # request id -> client identity
    self._group_of: dict[str, tuple[bytes, int]] = {}
    self._not_started: dict[tuple[bytes, int], set[str]] = {}  # waiting HTTP requests
    self._last_stats = None
    self._gone: set[bytes] = set()  # clients said gone: their late messages are ignored
    self._draining_logged = False

  def run(self, stop: threading.Event, drain: threading.Event | None = None) -> None:
    """Serves until `stop` is set (the loop ends after its step) or, once `drain` is set, until
    no client is connected (each has said ClientGone, or the supervisor said it for one)."""
    poller = zmq.Poller()
    poller.register(self._socket, zmq.POLLIN)
    core = self._core
    try:
      while not stop.is_set() and not self._drained(drain):
        added: dict[bytes, list[AddResult]] = defaultdict(list)
        answers: list[tuple[bytes, ControlDone]] = []
        timeout = 0 if core.can_step() else IDLE_POLL_MS
        while poller.poll(timeout):
          identity, payload = self._socket.recv_multipart(copy=True)
          self._handle(identity, payload, added, answers)
          timeout = 0
        outputs = core.step() if core.can_step() else []
        self._send(outputs, added)
        for identity, answer in answers:
          self._send_to(identity, answer)
    except BaseException as err:
      logger.exception("engine core failed")
      self._broadcast(CoreFailed(f"the engine core failed: {type(err).__name__}: {err}"))
      raise
    for identity in list(self._clients):
      self._drop_client(identity)

  def _drained(self, drain: threading.Event | None) -> bool:
    if drain is None or not drain.is_set():
      return False
    if self._clients and not self._draining_logged:
      self._draining_logged = True
      logger.info(
        "stopping once the %d API server(s) still connected have drained and gone",
        len(self._clients),
      )
    return not self._clients

  # -- input -------------------------------------------------------------------------------
  def _handle(
    self,
    identity: bytes,
    payload: bytes,
    added: dict[bytes, list[AddResult]],
    answers: list[tuple[bytes, ControlDone]],
  ) -> None:
    message = self._decoder.decode(payload)
    if identity in self._gone:  # sent before the client died, read after the supervisor's word
      return
    if isinstance(message, Hello):
      self._clients.setdefault(identity, set())
      self._send_to(
        identity,
        StepOutputs([], [], self._core.stats(), len(self._not_started), len(self._clients)),
      )
    elif isinstance(message, ClientGone):
      self._drop_client(message.identity.encode())
    elif isinstance(message, AddRequests):
      added[identity].append(self._add(identity, message))
    elif isinstance(message, AbortRequests):
      for request_id in message.request_ids:
        if self._owner.get(request_id) != identity:
          continue
        if message.stopped and self._core.stop_request(request_id):
          self._forget(request_id)
        else:
          self._core.abort_request(request_id)  # its "abort" output comes with the next step
    elif isinstance(message, (Sleep, WakeUp, IsSleeping)):
      answers.append((identity, self._control(message)))

  def _control(self, message: ControlCall) -> ControlDone:
    core = self._core
    try:
      if isinstance(message, Sleep):
        core.sleep(message.level, message.mode)
        logger.info("engine asleep (level %d)", message.level)
      elif isinstance(message, WakeUp):
        core.wake_up(message.tags)
        logger.info("engine woken up (%s)", ", ".join(message.tags or ["everything"]))
    except ValueError as err:
      return ControlDone(message.call, error=str(err), is_sleeping=core.is_sleeping)
    return ControlDone(message.call, is_sleeping=core.is_sleeping)

  def _add(self, identity: bytes, message: AddRequests) -> AddResult:
    done: list[str] = []
    try:
      if len(self._not_started) >= message.max_waiting:  # a 429 only for what could be served
        for request in message.requests:
          self._core.check_request(request)
        return AddResult(message.group, queue_full=True)
      for request in message.requests:
        self._core.add_request(request)
        done.append(request.request_id)
    except ValueError as err:
      for request_id in done:
        self._core.abort_request(request_id)  # its output goes nowhere: nobody owns it
      return AddResult(
        message.group, error=str(err), context_length=isinstance(err, ContextLengthError)
      )
    key = (identity, message.group)
    self._not_started[key] = set(done)
    requests = self._clients.setdefault(identity, set())
    for request_id in done:
      self._owner[request_id] = identity
      self._group_of[request_id] = key
      requests.add(request_id)
    return AddResult(message.group)

  def _drop_client(self, identity: bytes) -> None:
    """A client went away: abort its requests (their outputs go nowhere)."""
    self._gone.add(identity)
    requests = self._clients.pop(identity, set())
    for request_id in requests:
      self._core.abort_request(request_id)
      self._forget(request_id)
    if requests:
      logger.warning(
        "client %s disconnected: aborted its %d request(s)",
        identity.decode(errors="replace"),
        len(requests),
      )

  def _forget(self, request_id: str) -> None:
    identity = self._owner.pop(request_id, None)
    if identity is not None and identity in self._clients:
      self._clients[identity].discard(request_id)
    self._started(request_id)

  def _started(self, request_id: str) -> None:
    key = self._group_of.pop(request_id, None)
    if key is not None:
      waiting = self._not_started[key]
      waiting.discard(request_id)
      if not waiting:
        del self._not_started[key]

  # -- output ------------------------------------------------------------------------------
  def _send(self, outputs: list[EngineCoreOutput], added: dict[bytes, list[AddResult]]) -> None:
    by_client: dict[bytes, list[EngineCoreOutput]] = defaultdict(list)
    owner = self._owner
    for output in outputs:
      identity = owner.get(output.request_id)
      if identity is None:
        continue
      by_client[identity].append(output)
      if output.finish_reason is not None:
        self._forget(output.request_id)
      elif output.request_id in self._group_of:
        self._started(output.request_id)
    stats = self._core.stats()
    num_waiting, num_clients = len(self._not_started), len(self._clients)
    changed = (stats, num_waiting, num_clients) != self._last_stats
    self._last_stats = (stats, num_waiting, num_clients)
    for identity in self._clients:
      mine, answers = by_client.get(identity), added.get(identity)
      if mine or answers or changed:
        self._send_to(
          identity, StepOutputs(mine or [], answers or [], stats, num_waiting, num_clients)
        )

  def _send_to(self, identity: bytes, message: StepOutputs | CoreFailed | ControlDone) -> None:
    self._socket.send_multipart((identity, self._encoder.encode(message)), copy=False)

  def _broadcast(self, message: CoreFailed) -> None:
    for identity in list(self._clients):
      try:
        self._send_to(identity, message)
      except zmq.ZMQError:
        pass
