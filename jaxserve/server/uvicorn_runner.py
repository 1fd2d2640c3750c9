"""Runs one app under uvicorn with the drain: every API server (each API server process, and the
one of the one-process server) goes through run_app.

SIGTERM or SIGINT drains: the drain flag makes new requests (and /health) 503. The listening
socket stays open while responses run, so a client that connects during the drain gets that 503
(an OpenAI error body), not a refused connection; once none runs (at the latest when
server.drain_timeout_s has passed and those still running have ended with an error event and
[DONE], server/drain.py) uvicorn stops accepting connections and shuts down. A SIGINT while
draining (a second Ctrl-C) or END_NOW_SIGNAL (the supervisor's word for it) ends the running
responses at once, the same way; a repeated SIGTERM changes nothing. run_app owns these handlers
for the server's whole life (uvicorn's own would take a SIGINT after any stop signal as a forced
exit: tasks cancelled, streams cut without [DONE], a traceback each), a signal before uvicorn
listens included. A signal this process ignores stays ignored: an API server process of the
supervisor ignores SIGINT, whose Ctrl-C the supervisor acts on (core/child_signals.py). While
requests run, a stats line is logged every server.stats_interval_s (server/stats_logger.py).

uvicorn runs with server_config()'s settings: h11 with the connection guards of
server/http_protocol.py (stalled readers, slow request heads, the connection cap), TLS when
server.ssl_certfile is set, the keep-alive timeout and request head size of ServerConfig, its
loggers at server.uvicorn_log_level (else the command's --log-level) and its access log (a line
per request) unless server.uvicorn_access_log is false (vLLM's --uvicorn-log-level and
--disable-uvicorn-access-log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette

from jaxserve.config import ServerConfig
from jaxserve.core.child_signals import END_NOW_SIGNAL
from jaxserve.runtime.log_setup import UVICORN_LOG_CONFIG
from jaxserve.server.app import serving_state
from jaxserve.server.drain import UVICORN_GRACE_S, DrainTimer
from jaxserve.server.http_protocol import guarded_protocol
from jaxserve.server.stats_logger import StatsLogger

logger = logging.getLogger(__name__)
_POLL_S = 0.05


class DrainingServer(uvicorn.Server):
  """uvicorn's server, stopped by drain() and end_now() (run_app's signal handlers) rather than by
  uvicorn's own handlers."""

  def __init__(
    self,
    config: uvicorn.Config,
    draining: threading.Event,
    drain_timer: DrainTimer,
    drain_timeout_s: float,
  ):
    super().__init__(config)
    self.draining = draining
    self.drain_timer = drain_timer
    self.drain_timeout_s = drain_timeout_s

  @contextlib.contextmanager
  def capture_signals(self) -> Iterator[None]:
    yield  # run_app's handlers stay in place (the module docstring)

  def drain(self, sig: int) -> None:
    """New requests get 503; uvicorn shuts down once no response runs (shutdown below)."""
    if not self.draining.is_set():
      logger.info("signal %d: draining (new requests get 503)", sig)
    self.draining.set()
    self.drain_timer.start()
    self.should_exit = True

  def end_now(self, sig: int) -> None:
    """Drains, and ends the running responses now (an error event and [DONE] each)."""
    self.drain(sig)
    logger.info("signal %d: ending the running responses now", sig)
    self.drain_timer.end_now()

  async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
    """Keeps accepting (and answering 503) while responses run, then uvicorn's shutdown."""
    deadline = time.monotonic() + self.drain_timeout_s + UVICORN_GRACE_S / 2
    while self.server_state.tasks and time.monotonic() < deadline and not self.force_exit:
      await asyncio.sleep(_POLL_S)
    await super().shutdown(sockets)


def server_config(app: Starlette, config: ServerConfig, log_level: str) -> uvicorn.Config:
  """uvicorn's settings for an API server (see the module docstring)."""
  return uvicorn.Config(
    app,
    host=config.host,
    port=config.port,
    http=guarded_protocol(config),
    lifespan="on",
    log_level=(config.uvicorn_log_level or log_level).lower(),
    log_config=UVICORN_LOG_CONFIG,
    access_log=config.uvicorn_access_log,
    timeout_graceful_shutdown=config.drain_timeout_s + UVICORN_GRACE_S,
    timeout_keep_alive=config.timeout_keep_alive_s,
    h11_max_incomplete_event_size=config.h11_max_incomplete_event_size,
    ssl_keyfile=config.ssl_keyfile,
    ssl_certfile=config.ssl_certfile,
  )


def run_app(
  app: Starlette,
  config: ServerConfig,
  log_level: str,
  sock: socket.socket | None = None,
  stats_prefix: str = "",
) -> None:
  """Serves until a stop signal has drained the app (on `sock` if given, a listening socket
  shared with other processes, else on server.host:port)."""
  state = serving_state(app)
  uvicorn_config = server_config(app, config, log_level)
  drain_timer = DrainTimer(state.engine, config.drain_timeout_s)
  server = DrainingServer(uvicorn_config, state.draining, drain_timer, config.drain_timeout_s)
  stats_logger = StatsLogger(
    state.engine, state.metrics, config.stats_interval_s, prefix=stats_prefix
  ).start()

  def on_interrupt(sig, frame) -> None:
    if state.draining.is_set():
      server.end_now(sig)  # a second Ctrl-C
    else:
      server.drain(sig)

  handlers = {
    signal.SIGTERM: lambda sig, frame: server.drain(sig),
    signal.SIGINT: on_interrupt,
    END_NOW_SIGNAL: lambda sig, frame: server.end_now(sig),
  }
  if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # the supervisor acts on Ctrl-C
    del handlers[signal.SIGINT]
  previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
  try:
    server.run(sockets=[sock] if sock is not None else None)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    drain_timer.cancel()
    stats_logger.stop()
    state.executor.shutdown(wait=False)
