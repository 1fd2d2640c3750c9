"""`jaxserve serve`'s process supervisor: the engine core process (data_parallel_size of them
on one host, core/engine_cores.py), N API server processes.

    supervisor (this process: no jax, no HTTP)
      |-- engine core process(es) (core/process.py): LLMEngine's core, CoreLoop on a ROUTER
      |-- API server process 0..N-1 (the entry point `jaxserve serve` passes,
          server/api_process.py): uvicorn + CoreClient (DEALER)
                  \\___ all accept() on one listening socket the supervisor bound

The supervisor starts the core(s) and waits until each serves (the engine is built and warmed up),
binds the HTTP socket and spawns the API servers with it (vLLM's way of sharing one port among API
server processes; core/api_processes.py), keeping its own copy open (it never accepts on it) so a
restarted API server accepts on the same socket. Each child runs run_api_process: this module's
process set-up (logging, SIGINT ignored: core/child_signals.py), then the API server's entry
point with its ApiProcessArgs (core/info.py); core/ never imports server/. The core's CoreInfo
(tokenizer, model limits) reaches them in a file of a private temporary directory, so the spawns
do not wait for one another and the API servers start side by side; a second one is where they
share their request metrics (ApiProcessArgs.metrics_dir), so any of them answers /metrics for
all. Both are removed when the supervisor exits. Then it waits on the children:

* SIGTERM or SIGINT: forwarded to the API servers as SIGTERM (each drains, server/drain.py) and
  no API server is restarted any more; once all have exited the core gets SIGTERM; exit 0 (the
  core's own failure to stop cleanly aside). A terminal's Ctrl-C signals the whole process group,
  but the children ignore SIGINT (core/child_signals.py), so it drains exactly as a SIGINT to the
  supervisor alone. A SIGINT while draining (a second Ctrl-C) ends the running responses at once:
  the API servers get END_NOW_SIGNAL, their streams end with an error event and `[DONE]`, and
  they exit; a repeated SIGTERM changes nothing (`timeout` and systemd send one to the process and
  one to its group or cgroup). A core that got such a SIGTERM itself stops once its API servers
  have gone (core/process.py), maybe before the supervisor has seen them exit: a core that
  exits 0 while stopping has stopped, not died. A signal while the core is still starting
  (building, warming up) stops it at once (start_core_process's stop_requested: within about a
  second, core/process.py); exit 0. A signal later in start-up starts no further API server;
  those spawned drain as soon as they can (one still importing dies of the signal, one whose
  uvicorn is starting drains right after its start-up).
* An API server dies (killed, crashed, or drained by a signal sent to it alone): the supervisor
  tells each live core (ClientGone over its own DEALER socket), which aborts that process's requests
  (their streams were cut with the connection), logs one line with the exit code or signal and
  the back-off, and restarts it after the back-off (0.5 s doubling to 30 s, reset once a process
  has served 60 s: core/restart_backoff.py). Meanwhile the other API servers keep serving on the
  same socket; the `jaxserve_api_servers` gauge shows N - 1 until the new one says Hello.
* One of several engine cores (data_parallel_size > 1) dies: the API servers have already failed
  its open streams (an error event each; their client of that core saw the connection close)
  and route no new request to it; the others keep serving, /health says "degraded" (200) and
  jaxserve_engine_cores_alive drops; one log line with its cause. When the server stops later,
  it exits 1 (a core failed).
* The core dies (the last one, with several): the API servers have already failed their open
  streams (their CoreClient saw the connection close) and answer /health with 503;
  CORE_DEATH_GRACE_S later they are drained and the supervisor exits 1, with the cause in one
  log line. It does not restart the core: a
  new core would load the weights and compile (or read from the cache) every step program
  again, minutes on a large model during which the port would answer nothing but 503, and any
  state of the dead one (its KV cache, its requests) is lost anyway; an orchestrator restarting
  the whole server (systemd's Restart=, a Kubernetes pod) does the same and sees the failure.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path

import uvicorn

from jaxserve.config import EngineConfig
from jaxserve.core.api_processes import ApiProcesses, describe_exit
from jaxserve.core.engine_cores import EngineCores
from jaxserve.core.info import ApiProcessArgs, ApiServerEntry, write_core_info
from jaxserve.core.process import CoreStartError, CoreStartStopped
from jaxserve.runtime.log_setup import UVICORN_LOG_CONFIG

logger = logging.getLogger(__name__)
STOP_TIMEOUT_S = 30.0
CORE_DEATH_GRACE_S = 2.0
RESTART_POLL_S = 0.5


def default_api_server_count() -> int:
  """One API server process per 4 CPU cores, at least 1, at most 4."""
  return max(1, min(4, (os.cpu_count() or 1) // 4))


def run_api_process(entry: ApiServerEntry, args: ApiProcessArgs) -> None:
  """An API server process's target (multiprocessing spawn): SIGINT is ignored (the supervisor
  forwards a stop as SIGTERM; core/child_signals.py), then `entry` serves until drained."""
  from jaxserve.runtime.log_setup import configure_logging

  configure_logging(args.log_level)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  entry(args)


def serve_multiprocess(
  config: EngineConfig, count: int, log_level: str, entry: ApiServerEntry
) -> int:
  """Runs the server (the API server processes run `entry`) until it stops; the exit status."""
  stopping: list[int] = []
  apis: ApiProcesses | None = None

  def on_signal(sig, frame) -> None:
    again = bool(stopping)
    stopping.append(sig)
    if not again:
      logger.info("signal %d: draining the API server processes", sig)
    elif sig == signal.SIGINT:
      logger.info("signal %d again: ending the running responses now", sig)
    if apis is None:
      return
    if again and sig == signal.SIGINT:
      apis.end_now()
    else:
      apis.drain()

  info_dir = tempfile.TemporaryDirectory(prefix="jaxserve-api-")  # CoreInfo for the API servers
  metrics_dir = tempfile.TemporaryDirectory(prefix="jaxserve-metrics-")  # their shared metrics
  previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
  sock = None
  try:
    try:
      cores = EngineCores.start(config, log_level, stop_requested=lambda: bool(stopping))
    except CoreStartStopped:
      logger.info("stopped during start-up")
      return 0
    except CoreStartError as err:
      logger.error("the engine core did not start: %s", err)
      return 1
    try:
      if stopping:
        cores.stop(STOP_TIMEOUT_S)
        return 0
      server = config.server
      info_path = Path(info_dir.name) / "core_info.pickle"
      write_core_info(cores.info, info_path)
      sock = uvicorn.Config(
        None,
        host=server.host,
        port=server.port,
        log_config=UVICORN_LOG_CONFIG,
        log_level=server.uvicorn_log_level,  # its "Uvicorn running on" line
      ).bind_socket()

      def make_args(index: int, generation: int) -> ApiProcessArgs:
        return ApiProcessArgs(
          server,
          str(info_path),
          cores.addresses[0],
          sock,
          index,
          log_level,
          generation,
          metrics_dir.name,
          tuple(cores.addresses[1:]),
        )

      apis = ApiProcesses(count, make_args, run_api_process, entry)
      for slot in apis.slots:
        if stopping:  # a stop signal came while the API processes were starting
          break
        apis.spawn(slot)
      if stopping:  # the signal may have come between a start() and its slot
        apis.drain()
      logger.info(
        "serving %s on %s://%s:%d (warmup %.1fs): %s, API server pids %s",
        ", ".join(map(repr, server.model_names(cores.info.model_name))),
        "https" if server.ssl_certfile else "http",
        server.host,
        server.port,
        cores.info.warmup_seconds,
        cores.describe_pids(),
        ",".join(str(p.pid) for p in apis.running()),
      )
      return _supervise(cores, apis, stopping)
    finally:  # whatever happened, no child outlives the supervisor
      if apis is not None:
        apis.terminate(STOP_TIMEOUT_S)
      cores.stop(STOP_TIMEOUT_S)
  finally:
    if sock is not None:
      sock.close()
    info_dir.cleanup()
    metrics_dir.cleanup()
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def _supervise(cores: EngineCores, apis: ApiProcesses, stopping: list[int]) -> int:
  cores.connect()
  try:
    return _wait_for_children(cores, apis, stopping)
  finally:
    cores.close()


def _wait_for_children(cores: EngineCores, apis: ApiProcesses, stopping: list[int]) -> int:
  while not stopping or apis.running():
    pending = apis.seconds_to_next_restart()  # polled: a stop signal does not end a wait
    timeout = None if pending is None else min(pending, RESTART_POLL_S)
    ready = wait(list(cores.sentinels()) + apis.sentinels(), timeout)
    for index in cores.reap(ready):
      if stopping and cores.handles[index].process.exitcode == 0:
        continue  # the stop signal reached it too (a whole group's): it stopped once drained
      if not cores.live:
        return _last_core_died(cores, index, apis)
      _core_died(cores, index)
    for dead in apis.reap(ready):
      cores.client_gone(dead.identity)
      if not stopping:
        delay = apis.schedule_restart(dead)
        logger.error(
          "API server process %d (pid %d, %s) %s after %.1f s; restarting it in %.1f s",
          dead.slot.index,
          dead.pid,
          dead.identity,
          dead.cause,
          dead.uptime_s,
          delay,
        )
    restarted = apis.restart_due(lambda: bool(stopping))
    for slot in restarted:
      logger.info(
        "restarted API server process %d: pid %d (%s, restart %d)",
        slot.index,
        slot.process.pid,
        slot.identity,
        slot.backoff.restarts,
      )
    if restarted and stopping:  # a signal between a restart's start() and its slot
      apis.drain()
  status = 0
  for index, code in enumerate(cores.stop(STOP_TIMEOUT_S)):
    if code not in (0, None):
      handle = cores.handles[index]
      logger.error("engine core %d process %s: %s", index, describe_exit(code), handle.error())
      status = 1
  logger.info("stopped")
  return status


def _core_error(cores: EngineCores, index: int) -> str:
  handle = cores.handles[index]
  error = " ".join((handle.error() or "no error reported").split())
  return f"{describe_exit(handle.process.exitcode)}: {error}"


def _core_died(cores: EngineCores, index: int) -> None:
  """One engine core of several is gone: its requests have failed (their API servers saw its
  connection close); the others keep serving, /health says degraded."""
  logger.error(
    "engine core %d process died (%s); its requests ended with an error, the other %d engine "
    "core(s) keep serving (degraded; the supervisor does not restart a core: that would load "
    "the weights again)",
    index,
    _core_error(cores, index),
    len(cores.live),
  )


def _last_core_died(cores: EngineCores, index: int, apis: ApiProcesses) -> int:
  """Every core is gone: one log line with the cause, the API servers drained, exit status 1."""
  logger.error(
    "the engine core process died (%s); stopping the server with exit status 1 (the "
    "supervisor does not restart the core: that would load the weights again)",
    _core_error(cores, index)
    if len(cores.handles) == 1
    else f"engine core {index}, the last one: {_core_error(cores, index)}",
  )
  time.sleep(CORE_DEATH_GRACE_S)  # /health says 503 a moment before the port closes
  apis.drain()
  for process in apis.running():
    process.join(STOP_TIMEOUT_S)
  return 1
