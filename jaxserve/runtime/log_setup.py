"""Logging for the `jaxserve` command: one format, and no alarming lines the user cannot act on.

JAX probes every backend its plugins register when it first picks a device; on a machine without
a TPU the probe fails and jax._src.xla_bridge logs "Unable to initialize backend 'tpu': ..." at
INFO. The command runs on whatever backend exists, so that line is demoted to DEBUG
(`--log-level DEBUG` still shows it). Where libtpu is installed (the test and tpu extras) but no
TPU is attached, jaxserve/device/platforms.py keeps JAX from probing it at all: libtpu's own stderr
lines cannot be filtered here. A backend JAX was told to use (JAX_PLATFORMS) that fails
still raises, with JAX's own message.

Every process of `jaxserve serve` (the supervisor, the engine core, the API servers) logs in the
one format `LOG_FORMAT`, timestamps included: `configure_logging` also gives it to a handler that
Python's logging installed on its own first (a module-level `logging.log` call with no handler
configured, as absl's, which orbax makes at import in the engine core process, installs one in
logging's BASIC_FORMAT, without timestamps); other handlers (an application's, pytest's) are left
as they are. uvicorn is run with log_config=None (UVICORN_LOG_CONFIG), so its lines go through
the root logger's handler in the same format rather than uvicorn's own.

`kill -USR1 PID` on any of those processes prints every thread's Python stack to its stderr (the
server's log) and the process goes on: what a stuck process is doing, without stopping it
(`configure_logging` registers Python's faulthandler for the signal).
"""

from __future__ import annotations

import faulthandler
import io
import logging
import signal
import sys

JAX_BRIDGE_LOGGER = "jax._src.xla_bridge"
_PROBE_FAILURE = "Unable to initialize backend"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
UVICORN_LOG_CONFIG = None  # uvicorn.Config(log_config=...): its loggers propagate to the root


class BackendProbeFilter(logging.Filter):
  """Drops JAX's failed-backend-probe lines unless the logger is at DEBUG."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno <= logging.INFO and str(record.msg).startswith(_PROBE_FAILURE):
      return logging.getLogger(JAX_BRIDGE_LOGGER).getEffectiveLevel() <= logging.DEBUG
    return True


def configure_logging(level: str) -> None:
  logging.basicConfig(level=level, format=LOG_FORMAT)
  root = logging.getLogger()
  # basicConfig does nothing where the root logger has a handler already: its level must still
  # be the one asked for, and an implicit handler's format ours (see the module docstring)
  root.setLevel(level)
  for handler in root.handlers:
    formatter = handler.formatter
    if formatter is None or formatter._fmt == logging.BASIC_FORMAT:
      handler.setFormatter(logging.Formatter(LOG_FORMAT))
  _register_stack_dumps()
  bridge = logging.getLogger(JAX_BRIDGE_LOGGER)
  if not any(isinstance(f, BackendProbeFilter) for f in bridge.filters):
    bridge.addFilter(BackendProbeFilter())


def _register_stack_dumps() -> None:
  """Every thread's stack to the process's stderr on SIGUSR1 (see the module docstring); where
  there is no such signal or stderr has no file descriptor, nothing."""
  if not hasattr(signal, "SIGUSR1") or sys.__stderr__ is None:
    return
  try:
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
  except (OSError, ValueError, io.UnsupportedOperation):
    return
