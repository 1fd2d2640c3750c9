"""The one-process server: the engine core on a thread of the serving process.

`server.api_server_count: 0`, and process 0 of a multi-host job (whose engine must be built in
the process that joined jax.distributed), serve this way. It is the same transport as the
multi-process server, only without the processes: CoreThread runs CoreLoop (core/loop.py) over
the engine's core on a thread, bound to a ROUTER socket at a fresh ipc:// address, and one API
server (the entry point `jaxserve serve` passes, server/api_process.py) runs on the main thread
with its CoreClient connected to that address, exactly as an API server process connects to the
engine core process. So admission, /metrics, the drain and the errors are the same code either
way. The engine is built (model, buckets, KV pages, warmup) before the API server binds its
port, so once it accepts connections /health is 200.

If the loop fails, the CoreClient fails its streams (CoreFailed) and /health answers 503 until a
stop signal drains the API server; the process then exits 1. A stop signal (SIGTERM, SIGINT)
while the engine is still being built exits 0 at once, without the interpreter's finalization
(a compile thread inside XLA would hold it or crash it): there is nothing to drain yet.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import tempfile
import threading
import time
from pathlib import Path

import zmq

from jaxserve.config import EngineConfig
from jaxserve.core.info import ApiProcessArgs, ApiServerEntry, CoreInfo, write_core_info
from jaxserve.core.loop import CoreLoop
from jaxserve.core.router import bind_router, core_address, remove_address
from jaxserve.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)
STOP_TIMEOUT_S = 30.0


class CoreThread:
  """CoreLoop over `engine`'s core on a thread, at `address` (default: a fresh ipc:// one).
  Nothing else may use the engine while the thread runs."""

  def __init__(self, engine: LLMEngine, address: str | None = None):
    self.address = address or core_address()
    self.info = CoreInfo.of(engine)
    self._engine = engine
    self._stop = threading.Event()
    self._bound = threading.Event()
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._run, name="jaxserve-engine-core", daemon=True)

  def start(self) -> CoreThread:
    """Returns once the socket is bound (clients may connect); raises if it could not be."""
    self._thread.start()
    self._bound.wait()
    if self._error is not None:
      self._thread.join()
      raise self._error
    return self

  def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
    """Ends the loop after its current step (the clients' requests are aborted)."""
    self._stop.set()
    self._thread.join(timeout)

  @property
  def error(self) -> BaseException | None:
    """What ended the loop, if it failed."""
    return self._error

  def _run(self) -> None:
    context = zmq.Context()
    socket = None
    try:
      socket = bind_router(context, self.address)
      self._bound.set()
      CoreLoop(self._engine.core, socket).run(self._stop)
    except BaseException as err:  # noqa: BLE001 - CoreLoop logged it and told its clients
      self._error = err
    finally:
      self._bound.set()
      if socket is not None:
        socket.close()
      context.term()
      remove_address(self.address)


@contextlib.contextmanager
def _exit_on_stop_signal():
  """While building the engine: a stop signal exits the process at once (status 0)."""
  from jaxserve.device.compile_threads import exit_now

  def on_signal(sig, frame) -> None:
    logger.info("signal %d: stopped during start-up", sig)
    exit_now(0)

  signals = (signal.SIGTERM, signal.SIGINT)
  previous = {sig: signal.signal(sig, on_signal) for sig in signals}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def serve_in_process(config: EngineConfig, log_level: str, entry: ApiServerEntry) -> int:
  """Builds the engine, serves it through `entry` until a stop signal has drained it; the exit
  status (1 if the engine core failed)."""
  from jaxserve.composition.assembly import build_engine

  server = config.server
  start = time.monotonic()
  with _exit_on_stop_signal():
    engine = build_engine(config, default_warmup="background")  # ready after one bucket
  try:
    core = CoreThread(engine).start()
    try:
      with tempfile.TemporaryDirectory(prefix="jaxserve-api-") as info_dir:
        info_path = Path(info_dir) / "core_info.pickle"
        write_core_info(core.info, info_path)
        logger.info(
          "ready in %.1fs (warmup %.1fs): serving %s on http://%s:%d%s",
          time.monotonic() - start,
          engine.warmup_seconds,
          ", ".join(map(repr, server.model_names(config.model))),
          server.host,
          server.port,
          " (API key required)" if server.api_key else "",
        )
        entry(ApiProcessArgs(server, str(info_path), core.address, None, 0, log_level))
    finally:
      core.stop()
  finally:
    engine.close()
  status = 0
  if core.error is not None:
    logger.error("the engine core failed: %s: %s", type(core.error).__name__, core.error)
    status = 1
  else:
    logger.info("stopped")
  from jaxserve.device.compile_threads import compilation_abandoned, exit_now

  if compilation_abandoned():  # a stop during background compilation: no finalization
    exit_now(status)
  return status
