"""The HTTP/1.1 connection every API server runs: uvicorn's h11 protocol with the guards that keep
one client from holding a connection, a stream or an API server forever (what nginx's
send_timeout and client_header_timeout and uvicorn's limit_concurrency do):

* A stalled reader (server.stream_stall_timeout_s, `--stream-stall-timeout`): the kernel keeps
  at most UNSENT_KERNEL_BYTES of a connection's output unsent (TCP_NOTSENT_LOWAT, where the
  platform has it: Linux would otherwise let a TCP send buffer grow to 4 MiB, minutes of a
  stream's output, before the server noticed anything); past that, and past the transport's
  high-water mark (64 KiB), uvicorn stops writing and the handler waits; if the client then
  takes nothing for stream_stall_timeout_s (the transport's buffer does not shrink), the
  connection is aborted (a reset: the buffered bytes are dropped). The handler sees the
  disconnect and its response ends as any other whose client left: its engine requests are
  aborted, their KV pages freed, within a step (server/generation.py). A slow reader that keeps
  taking bytes is never cut; its unsent output stays bounded all the same: in the kernel by
  UNSENT_KERNEL_BYTES, in the transport by the high-water mark, the outputs waiting for the
  handler by `OutputStream`'s per-request limit (core/streams.py). No timer runs while the
  client keeps up, so the guard costs the other streams nothing.
* A slow request head (server.header_timeout_s): a connection whose request line and headers
  have not all arrived header_timeout_s after it opened, or after its previous response ended, is
  closed (a client that opens connections and sends nothing, or a byte at a time, would hold
  them and, with a cap, lock everyone else out). An idle keep-alive connection is closed sooner,
  after server.timeout_keep_alive_s (uvicorn's own timer). A request head still incomplete
  past server.h11_max_incomplete_event_size bytes gets 400 (h11 buffers no more of it).
* The connection cap (server.limit_concurrency): a request that arrives while more than that
  many connections are open, or more than that many requests run in this API server (itself
  included), gets 503 with OpenAI's error body and `Connection: close` (uvicorn's own
  limit_concurrency answers a plain-text 503, and counts one fewer). /health and /metrics are
  exempt, so probes and scrapers still see an overloaded server.

Protocol-level errors (the 400 for a malformed or oversized head) are written with OpenAI's
error body too. Everything else is uvicorn's H11Protocol: `guarded_protocol` returns the factory
uvicorn.Config(http=...) takes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from jaxserve.config import ServerConfig
from jaxserve.server.errors import ApiError, unavailable

logger = logging.getLogger(__name__)
EXEMPT_PATHS = ("/health", "/metrics")
UNSENT_KERNEL_BYTES = 128 * 1024
_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", None)


def guarded_protocol(config: ServerConfig) -> functools.partial:
  """The protocol factory for uvicorn.Config(http=...) with `config`'s guards."""
  return functools.partial(
    GuardedH11Protocol,
    stall_timeout_s=config.stream_stall_timeout_s,
    header_timeout_s=config.header_timeout_s,
    limit_concurrency=config.limit_concurrency,
  )


class GuardedH11Protocol(H11Protocol):
  """One connection (see the module docstring)."""

  def __init__(
    self,
    *args,
    stall_timeout_s: float,
    header_timeout_s: float,
    limit_concurrency: int | None,
    **kwargs,
  ):
    super().__init__(*args, **kwargs)
    self._stall_timeout_s = stall_timeout_s
    self._header_timeout_s = header_timeout_s
    self._stall_timer: asyncio.TimerHandle | None = None
    self._header_timer: asyncio.TimerHandle | None = None
    if limit_concurrency is not None:
      self.app = ConnectionCap(self.app, limit_concurrency, self.connections, self.tasks)

  # -- the connection's life ---------------------------------------------------------------
  def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
    super().connection_made(transport)
    _limit_unsent(transport)
    self._arm_header_timer()

  def connection_lost(self, exc: Exception | None) -> None:
    self._cancel_timers()
    super().connection_lost(exc)

  def handle_events(self) -> None:
    super().handle_events()
    if self.conn.their_state is not h11.IDLE and self._header_timer is not None:
      self._header_timer.cancel()  # the head is in (or the connection failed)
      self._header_timer = None

  def on_response_complete(self) -> None:
    super().on_response_complete()
    if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
      self._arm_header_timer()  # the next request's head

  def send_400_response(self, msg: str) -> None:
    """uvicorn's 400 for a request h11 cannot parse, with OpenAI's error body."""
    body = json.dumps(
      ApiError(400, f"invalid HTTP request: {msg}", code="invalid_http_request").body()
    ).encode()
    headers = [
      (b"content-type", b"application/json"),
      (b"content-length", str(len(body)).encode()),
      (b"connection", b"close"),
    ]
    self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers)))
    self.transport.write(self.conn.send(h11.Data(data=body)))
    self.transport.write(self.conn.send(h11.EndOfMessage()))
    self.transport.close()

  # -- the stall guard ---------------------------------------------------------------------
  def pause_writing(self) -> None:
    super().pause_writing()
    if self._stall_timeout_s > 0 and self._stall_timer is None:
      self._watch_stall(self.transport.get_write_buffer_size())

  def resume_writing(self) -> None:
    if self._stall_timer is not None:
      self._stall_timer.cancel()
      self._stall_timer = None
    super().resume_writing()

  def _watch_stall(self, buffered: int) -> None:
    self._stall_timer = self.loop.call_later(self._stall_timeout_s, self._check_stall, buffered)

  def _check_stall(self, buffered_then: int) -> None:
    self._stall_timer = None
    if not self.flow.write_paused or self.transport.is_closing():
      return
    buffered = self.transport.get_write_buffer_size()
    if buffered < buffered_then:  # it took some bytes: a slow reader, not a stalled one
      self._watch_stall(buffered)
      return
    path = self.scope["path"] if self.scope is not None else "?"
    logger.warning(
      "client %s took nothing of its %s response for %g s (server.stream_stall_timeout_s) with "
      "%d bytes waiting: disconnected, its requests are aborted",
      _address(self.client),
      path,
      self._stall_timeout_s,
      buffered,
    )
    self.transport.abort()

  # -- the header timeout ------------------------------------------------------------------
  def _arm_header_timer(self) -> None:
    if self._header_timeout_s > 0 and self._header_timer is None:
      self._header_timer = self.loop.call_later(self._header_timeout_s, self._header_timed_out)

  def _header_timed_out(self) -> None:
    self._header_timer = None
    if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
      return
    if self.timeout_keep_alive_task is not None:
      return  # an idle keep-alive connection: uvicorn's own timer closes it
    logger.info(
      "client %s sent no complete request head within %g s (server.header_timeout_s): closed",
      _address(self.client),
      self._header_timeout_s,
    )
    self.transport.close()

  def _cancel_timers(self) -> None:
    for timer in (self._stall_timer, self._header_timer):
      if timer is not None:
        timer.cancel()
    self._stall_timer = self._header_timer = None


class ConnectionCap:
  """ASGI: a 503 (OpenAI's body, Connection: close) for a request past the connection cap."""

  def __init__(self, app: ASGIApp, limit: int, connections: set, tasks: set):
    self.app, self.limit = app, limit
    self._connections, self._tasks = connections, tasks

  async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
    if (
      scope["type"] == "http"
      and scope["path"] not in EXEMPT_PATHS
      and (len(self._connections) > self.limit or len(self._tasks) > self.limit)
    ):
      logger.warning(
        "refused a request: %d connections open, %d requests running (server.limit_concurrency %d)",
        len(self._connections),
        len(self._tasks),
        self.limit,
      )
      response = unavailable(
        f"this API server is at its connection limit ({self.limit}, server.limit_concurrency); "
        "retry later"
      ).response()
      response.headers["connection"] = "close"
      await response(scope, receive, send)
      return
    await self.app(scope, receive, send)


def _limit_unsent(transport: asyncio.Transport) -> None:
  """The kernel sends a TCP connection's output with at most UNSENT_KERNEL_BYTES waiting."""
  sock = transport.get_extra_info("socket")
  if _NOTSENT_LOWAT is None or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
    return
  try:
    sock.setsockopt(socket.IPPROTO_TCP, _NOTSENT_LOWAT, UNSENT_KERNEL_BYTES)
  except OSError:  # a kernel without it: the stall guard still works, later
    pass


def _address(client: tuple[str, int] | None) -> str:
  return f"{client[0]}:{client[1]}" if client else "?"
