"""The engine core process: builds the engine, binds the core's socket, runs CoreLoop.

start_core_process() spawns it (multiprocessing "spawn": the parent never imports jax) and waits
until the engine is built and warmed up; the child then sends CoreReady with its CoreInfo
(core/info.py: the tokenizer and the model's limits, pickled once over a multiprocessing pipe:
API server processes need them and never load the model). If the build or the loop fails, the
child sends a CoreFailure with the error's text on the same pipe before it exits non-zero, so the
supervisor can report it (a ValueError is a bad setting, `bad_setting`: start_core_process
raises it as a ValueError and `jaxserve serve` reports it as any bad flag, status 2).

Why pyzmq for the step traffic: ZeroMQ's ROUTER/DEALER sockets give one connection per API
server process with routing by identity, message framing, a monitor that sees the core's end
close (a dead core is noticed at once, even after SIGKILL) and background I/O threads that write
while the core computes, over a Unix socket (ipc://) with no broker (docs/DECISIONS.md, "pyzmq
for the step traffic").

Signals: SIGTERM stops the loop once no API server is connected any more (CoreLoop's `drain`):
at once when the supervisor sends it, after the API server processes have drained and gone; a
SIGTERM that reached the core with its API servers still draining (`timeout`, or systemd, signals
a whole process group or cgroup) lets them finish their streams first, and the loop stops
regardless server.drain_timeout_s + STOP_GRACE_S after the signal. SIGTERM before the core
serves (it is still building or warming up the engine) exits at once, and start_core_process,
asked to stop meanwhile (`stop_requested`), sends it and kills the core if it has not exited
STARTUP_STOP_WAIT_S later (a thread inside XLA's compiler would hold its exit), so Ctrl-C during
start-up exits within about a second. SIGINT is ignored from the child's start
(core/child_signals.py): the supervisor decides when the core stops.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from jaxserve.config import EngineConfig
from jaxserve.core.child_signals import start_ignoring_sigint
from jaxserve.core.device_groups import DeviceGroup
from jaxserve.core.info import CoreInfo
from jaxserve.core.router import bind_router, core_address, remove_address
from jaxserve.runtime.gc_pauses import GcPauses

logger = logging.getLogger(__name__)
STARTUP_STOP_WAIT_S = 1.0
STOP_GRACE_S = 10.0  # past the drain timeout: the API servers' own grace (5 s) and their exit
LONG_GC_PAUSE_S = 0.05  # a collection that held the engine's steps this long is logged
_STARTUP_POLL_S = 0.05


@dataclass(frozen=True)
class CoreReady:
  """The core's first message on the pipe once it serves."""

  info: CoreInfo


@dataclass(frozen=True)
class CoreFailure:
  """The core's fatal error, its last message on the pipe (before or after CoreReady).
  bad_setting: a ValueError (a missing checkpoint...), which the CLI reports as a bad flag."""

  message: str
  bad_setting: bool = False


PipeMessage = CoreReady | CoreFailure  # what the start-up pipe carries, child to parent


class CoreStartError(RuntimeError):
  """The engine core process failed before it served."""


class CoreStartStopped(RuntimeError):
  """start_core_process was asked to stop before the core served; the core has exited."""


@dataclass
class CoreHandle:
  process: multiprocessing.process.BaseProcess
  address: str
  info: CoreInfo
  errors: Connection  # the core writes its CoreFailure here before it exits non-zero

  def stop(self, timeout: float = 30.0) -> int | None:
    """SIGTERM, then wait; the exit code."""
    if self.process.is_alive():
      os.kill(self.process.pid, signal.SIGTERM)
    return self.wait_stopped(timeout)

  def wait_stopped(self, timeout: float) -> int | None:
    """Waits for a core sent SIGTERM once (a second one could land while the interpreter shuts
    down, its handler gone, and kill it), SIGKILL after `timeout`; the exit code."""
    self.process.join(timeout)
    if self.process.is_alive():
      self.process.kill()
      self.process.join(5)
    return self.process.exitcode

  def error(self) -> str | None:
    """The text of the core's fatal error, if it sent one."""
    try:
      if self.errors.poll(0):
        message: PipeMessage = self.errors.recv()
        return message.message if isinstance(message, CoreFailure) else None
    except (EOFError, OSError):
      pass
    return None


@dataclass
class StartingCore:
  """A core process spawned and not yet serving (spawn_core_process); wait_until_serving()."""

  process: multiprocessing.process.BaseProcess
  address: str
  pipe: Connection


def start_core_process(
  config: EngineConfig,
  log_level: str = "INFO",
  address: str | None = None,
  stop_requested: Callable[[], bool] | None = None,
  group: DeviceGroup | None = None,
) -> CoreHandle:
  """Spawns the core and returns once it serves (spawn_core_process, wait_until_serving)."""
  starting = spawn_core_process(config, log_level, address, group)
  return wait_until_serving(starting, stop_requested)


def spawn_core_process(
  config: EngineConfig,
  log_level: str = "INFO",
  address: str | None = None,
  group: DeviceGroup | None = None,
) -> StartingCore:
  """Starts the core's process; `group` confines it to its devices (one engine core of
  several, core/device_groups.py)."""
  address = address or core_address()
  context = multiprocessing.get_context("spawn")
  parent_end, child_end = context.Pipe(duplex=False)
  suffix = "" if group is None else f"-{group.index}"
  process = context.Process(
    target=run_core_process,
    args=(config, address, child_end, log_level, group),
    name=f"jaxserve-engine-core{suffix}",
    daemon=False,
  )
  start_ignoring_sigint(process)
  child_end.close()
  return StartingCore(process, address, parent_end)


def wait_until_serving(
  starting: StartingCore, stop_requested: Callable[[], bool] | None = None
) -> CoreHandle:
  """The core's handle once it serves; the child's ValueError (a bad setting) or a
  CoreStartError with its error if the engine could not be built; CoreStartStopped once the core
  has exited if `stop_requested()` turned true first (polled every 50 ms)."""
  process, address, parent_end = starting.process, starting.address, starting.pipe
  while stop_requested is not None and not parent_end.poll(_STARTUP_POLL_S):
    if stop_requested():
      stop_starting(starting)
      raise CoreStartStopped("stopped before the engine core served")
  try:
    message: PipeMessage = parent_end.recv()
  except EOFError:
    process.join(5)
    raise CoreStartError(
      f"the engine core process exited with code {process.exitcode} before it served"
    ) from None
  if isinstance(message, CoreFailure):
    process.join(30)
    if message.bad_setting:  # the CLI reports it as its own
      raise ValueError(message.message)
    raise CoreStartError(message.message)
  return CoreHandle(process, address, message.info, parent_end)


def stop_starting(starting: StartingCore) -> None:
  """Stops a core that has not served yet (a stop signal, or another core failed)."""
  _stop_starting(starting.process)
  remove_address(starting.address)


def _stop_starting(process: multiprocessing.process.BaseProcess) -> None:
  """SIGTERM to a core that is still starting; SIGKILL if it has not exited in time."""
  if process.is_alive():
    os.kill(process.pid, signal.SIGTERM)
  process.join(STARTUP_STOP_WAIT_S)
  if process.is_alive():
    process.kill()
    process.join(5)


def _send_quietly(pipe: Connection, message: CoreFailure) -> None:
  try:
    pipe.send(message)
  except OSError:
    pass


def _log_long_gc_pause(generation: int, seconds: float) -> None:
  if seconds >= LONG_GC_PAUSE_S:
    logger.warning(
      "engine core: a generation-%d garbage collection held the step loop for %.0f ms",
      generation,
      1e3 * seconds,
    )


def run_core_process(
  config: EngineConfig,
  address: str,
  pipe: Connection,
  log_level: str,
  group: DeviceGroup | None = None,
) -> None:
  """The child's entry point. `group`: its devices' variables are set before jax starts."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if group is not None:
    if "jax" in sys.modules:
      raise RuntimeError("jax was imported before the engine core's devices were chosen")
    os.environ.update(dict(group.env))
  import zmq

  from jaxserve.composition.assembly import build_engine
  from jaxserve.core.loop import CoreLoop
  from jaxserve.device.platforms import prepare_jax_process
  from jaxserve.runtime.log_setup import configure_logging

  configure_logging(log_level)
  stop = threading.Event()  # set: the loop ends after its step
  drain = threading.Event()  # set: the loop ends once no API server is connected
  serving = threading.Event()

  def on_sigterm(sig, frame) -> None:
    if not serving.is_set():
      stop.set()
      raise SystemExit(0)  # still starting: nothing to drain
    if not drain.is_set():
      drain.set()
      deadline = threading.Timer(config.server.drain_timeout_s + STOP_GRACE_S, stop.set)
      deadline.daemon = True
      deadline.start()

  signal.signal(signal.SIGTERM, on_sigterm)
  context = zmq.Context()
  socket = None
  try:
    prepare_jax_process(config.cache.memory_fraction)
    devices = None
    if group is not None:
      from jaxserve.parallel.device_slice import select_devices

      devices = select_devices(group.slice_start, group.count, group.platform)
      logger.info("%s: %s", group.describe(), ", ".join(str(d) for d in devices))
    # ready after one bucket
    engine = build_engine(config, default_warmup="background", devices=devices)
    socket = bind_router(context, address)
    gc.collect()
    gc.freeze()  # the engine's long-lived objects: later collections do not scan them
    GcPauses(_log_long_gc_pause).start()  # for the process's life
    serving.set()
    pipe.send(CoreReady(CoreInfo.of(engine)))
    try:
      CoreLoop(engine.core, socket).run(stop, drain)
    finally:
      engine.close()
  except ValueError as err:  # bad settings (a missing checkpoint...): the parent reports it
    _send_quietly(pipe, CoreFailure(str(err), bad_setting=True))
    sys.exit(2)
  except SystemExit:
    raise
  except BaseException as err:
    _send_quietly(pipe, CoreFailure(f"{type(err).__name__}: {err}"))
    raise
  finally:
    if socket is not None:
      socket.close()
    context.term()
    remove_address(address)
  from jaxserve.device.compile_threads import compilation_abandoned, exit_now

  if compilation_abandoned():  # a stop during background compilation: exit now
    exit_now(0)
