"""Runs one app under uvicorn with the drain: every API server (each API server process, and the
one of the one-process server) goes through run_app.

SIGTERM or SIGINT drains: the drain flag makes new requests (and /health) 503. The listening
socket stays open while responses run, so a client that connects during the drain gets that 503
(an OpenAI error body), not a refused connection; once none runs (at the latest when
server.drain_timeout_s has passed and those still running have ended with an error event and
[DONE], server/drain.py) uvicorn stops accepting connections and shuts down. While requests
run, a stats line is logged every server.stats_interval_s (server/stats_logger.py).

uvicorn runs with server_config()'s settings: h11 with the connection guards of
server/http_protocol.py (stalled readers, slow request heads, the connection cap), TLS when
server.ssl_certfile is set, the keep-alive timeout and request head size of ServerConfig, its
loggers at server.uvicorn_log_level (else the command's --log-level) and its access log (a line
per request) unless server.uvicorn_access_log is false (vLLM's --uvicorn-log-level and
--disable-uvicorn-access-log).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette

from jaxserve.config import ServerConfig
from jaxserve.log_setup import UVICORN_LOG_CONFIG
from jaxserve.server.app import serving_state
from jaxserve.server.drain import UVICORN_GRACE_S, DrainTimer
from jaxserve.server.http_protocol import guarded_protocol
from jaxserve.server.stats_logger import StatsLogger

logger = logging.getLogger(__name__)
_POLL_S = 0.05


class DrainingServer(uvicorn.Server):
  """uvicorn's server that also raises the app's drain flag when a stop signal arrives."""

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

  def handle_exit(self, sig, frame) -> None:
    if not self.draining.is_set():
      logger.info("signal %d: draining (new requests get 503)", sig)
    self.draining.set()
    self.drain_timer.start()
    super().handle_exit(sig, frame)

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

  def early_or_repeated(sig, frame) -> None:
    """Installed around uvicorn's own handlers: a signal that arrives before uvicorn listens
    (the process is still starting) drains like any other; the one uvicorn re-raises after
    its graceful shutdown finds the drain done and does nothing."""
    if not state.draining.is_set():
      server.handle_exit(sig, frame)

  previous = {sig: signal.signal(sig, early_or_repeated) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    server.run(sockets=[sock] if sock is not None else None)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    drain_timer.cancel()
    stats_logger.stop()
    state.executor.shutdown(wait=False)
