"""`jaxserve serve`'s process supervisor: one engine core process, N API server processes.

    supervisor (this process: no jax, no HTTP)
      |-- engine core process (core/process.py): LLMEngine's core, CoreLoop on a ROUTER
      |-- API server process 0..N-1 (the entry point `jaxserve serve` passes,
          server/api_process.py): uvicorn + CoreClient (DEALER)
                  \\___ all accept() on one listening socket the supervisor bound

The supervisor starts the core and waits until it serves (the engine is built and warmed up),
binds the HTTP socket, spawns the API servers with it (vLLM's way of sharing one port among API
server processes) and closes its own copy. Each child runs run_api_process: this module's
process set-up (logging, SIGINT left to the supervisor), then the API server's entry point with
its ApiProcessArgs (core/info.py); core/ never imports server/. The core's CoreInfo (tokenizer,
model limits) reaches them in a file of a private temporary directory, so the spawns do not wait
for one another and the API servers start side by side; a second one is where they share their
request metrics (ApiProcessArgs.metrics_dir), so any of them answers /metrics for all. Both are
removed when the supervisor exits. Then it waits on the children:

* SIGTERM or SIGINT: forwarded to the API servers as SIGTERM (each drains, server/drain.py);
  once all have exited the core gets SIGTERM; exit 0. A signal while the core is still starting
  (building, warming up) stops it at once (start_core_process's stop_requested: within about a
  second, core/process.py); exit 0. A signal later in start-up starts no further API server;
  those spawned drain as soon as they can (one still importing dies of the signal, one whose
  uvicorn is starting drains right after its start-up).
* The core dies: the API servers have already failed their open streams (their CoreClient saw
  the connection close) and answer /health with 503; CORE_DEATH_GRACE_S later they are drained
  and the supervisor exits 1, logging the core's error.
* An API server dies: the supervisor tells the core (ClientGone over its own DEALER socket),
  which aborts that process's requests; the others keep serving. When none is left the
  supervisor stops the core and exits 1.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path

import msgspec
import uvicorn
import zmq

from jaxserve.config import EngineConfig
from jaxserve.core.info import ApiProcessArgs, ApiServerEntry, api_identity, write_core_info
from jaxserve.core.messages import ClientGone
from jaxserve.core.process import CoreStartError, CoreStartStopped, start_core_process
from jaxserve.log_setup import UVICORN_LOG_CONFIG

logger = logging.getLogger(__name__)
STOP_TIMEOUT_S = 30.0
CORE_DEATH_GRACE_S = 2.0


def default_api_server_count() -> int:
  """One API server process per 4 CPU cores, at least 1, at most 4."""
  return max(1, min(4, (os.cpu_count() or 1) // 4))


def run_api_process(entry: ApiServerEntry, args: ApiProcessArgs) -> None:
  """An API server process's target (multiprocessing spawn): SIGINT is ignored (the supervisor
  forwards a stop as SIGTERM), then `entry` serves until drained."""
  from jaxserve.log_setup import configure_logging

  configure_logging(args.log_level)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  entry(args)


def serve_multiprocess(
  config: EngineConfig, count: int, log_level: str, entry: ApiServerEntry
) -> int:
  """Runs the server (the API server processes run `entry`) until it stops; the exit status."""
  stopping: list[int] = []

  def on_signal(sig, frame) -> None:
    if not stopping:
      logger.info("signal %d: draining the API server processes", sig)
    stopping.append(sig)
    _drain(apis)

  apis: list[multiprocessing.process.BaseProcess] = []
  info_dir = tempfile.TemporaryDirectory(prefix="jaxserve-api-")  # CoreInfo for the API servers
  metrics_dir = tempfile.TemporaryDirectory(prefix="jaxserve-metrics-")  # their shared metrics
  previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    try:
      core = start_core_process(config, log_level, stop_requested=lambda: bool(stopping))
    except CoreStartStopped:
      logger.info("stopped during start-up")
      return 0
    except CoreStartError as err:
      logger.error("the engine core did not start: %s", err)
      return 1
    try:
      if stopping:
        core.stop(STOP_TIMEOUT_S)
        return 0
      server = config.server
      info_path = Path(info_dir.name) / "core_info.pickle"
      write_core_info(core.info, info_path)
      sock = uvicorn.Config(
        None, host=server.host, port=server.port, log_config=UVICORN_LOG_CONFIG
      ).bind_socket()
      context = multiprocessing.get_context("spawn")
      for index in range(count):
        if stopping:  # a stop signal came while the API processes were starting
          break
        args = ApiProcessArgs(
          server, str(info_path), core.address, sock, index, log_level, metrics_dir.name
        )
        process = context.Process(
          target=run_api_process, name=f"jaxserve-api-{index}", args=(entry, args)
        )
        process.start()
        apis.append(process)
      sock.close()
      if stopping:  # the signal may have come between a start() and its append
        _drain(apis)
      logger.info(
        "serving %r on http://%s:%d (warmup %.1fs): engine core pid %d, API server pids %s",
        server.served_model_name or core.info.model_name,
        server.host,
        server.port,
        core.info.warmup_seconds,
        core.process.pid,
        ",".join(str(p.pid) for p in apis),
      )
      return _supervise(core, apis, stopping)
    finally:  # whatever happened, no child outlives the supervisor
      for process in apis:
        if process.is_alive():
          process.terminate()
          process.join(STOP_TIMEOUT_S)
      core.stop(STOP_TIMEOUT_S)
  finally:
    info_dir.cleanup()
    metrics_dir.cleanup()
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def _drain(apis: list[multiprocessing.process.BaseProcess]) -> None:
  """SIGTERM to every running API process (a second one is harmless: the drain starts once)."""
  for process in apis:
    if process.is_alive():
      os.kill(process.pid, signal.SIGTERM)


def _supervise(core, apis, stopping: list[int]) -> int:
  context = zmq.Context()
  control = context.socket(zmq.DEALER)
  control.setsockopt(zmq.IDENTITY, b"supervisor")
  control.setsockopt(zmq.LINGER, 1000)
  control.connect(core.address)
  try:
    return _wait_for_children(core, apis, stopping, control)
  finally:
    control.close()
    context.term()


def _wait_for_children(core, apis, stopping: list[int], control: zmq.Socket) -> int:
  status = 0
  alive = list(apis)
  while alive:
    ready = wait([core.process.sentinel] + [p.sentinel for p in alive])
    if core.process.sentinel in ready:
      core.process.join()
      error = core.error() or f"exit code {core.process.exitcode}"
      logger.error("the engine core process died: %s", error)
      status = 1
      time.sleep(CORE_DEATH_GRACE_S)  # /health says 503 a moment before the port closes
      for process in alive:
        if process.is_alive():
          os.kill(process.pid, signal.SIGTERM)
      for process in alive:
        process.join(STOP_TIMEOUT_S)
      return status
    for process in [p for p in alive if p.sentinel in ready]:
      process.join()
      alive.remove(process)
      control.send(msgspec.msgpack.encode(ClientGone(api_identity(apis.index(process)))))
      if not stopping:
        logger.error(
          "API server process %s exited with code %s; %d left",
          process.name,
          process.exitcode,
          len(alive),
        )
        status = 1
  code = core.stop(STOP_TIMEOUT_S)
  if code not in (0, None):
    logger.error("the engine core process exited with code %s: %s", code, core.error())
    status = 1
  logger.info("stopped")
  return status
