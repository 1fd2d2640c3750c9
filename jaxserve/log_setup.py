"""Logging for the `jaxserve` command: one format, and no alarming lines the user cannot act on.

JAX probes every backend its plugins register when it first picks a device; on a machine without
a TPU the probe fails and jax._src.xla_bridge logs "Unable to initialize backend 'tpu': ..." at
INFO. The command runs on whatever backend exists, so that line is demoted to DEBUG
(`--log-level DEBUG` still shows it). Where libtpu is installed (the test and tpu extras) but no
TPU is attached, jaxserve/platforms.py keeps JAX from probing it at all: libtpu's own stderr
lines cannot be filtered here. A backend JAX was told to use (JAX_PLATFORMS) that fails
still raises, with JAX's own message.

Every process of `jaxserve serve` (the supervisor, the engine core, the API servers) logs in the
one format `LOG_FORMAT`, timestamps included: `configure_logging` replaces whatever handler an
import gave the root logger first (the engine core imports jax before it configures logging), and
uvicorn is run with log_config=None (UVICORN_LOG_CONFIG), so its lines go through the root
logger's handler in the same format rather than uvicorn's own.
"""

from __future__ import annotations

import logging

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
  # force: an import may have given the root logger a handler already (the engine core process
  # imports jax before configuring), whose format would differ
  logging.basicConfig(level=level, format=LOG_FORMAT, force=True)
  bridge = logging.getLogger(JAX_BRIDGE_LOGGER)
  if not any(isinstance(f, BackendProbeFilter) for f in bridge.filters):
    bridge.addFilter(BackendProbeFilter())
