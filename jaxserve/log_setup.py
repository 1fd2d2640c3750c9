"""Logging for the `jaxserve` command: one format, and no alarming lines the user cannot act on.

JAX probes every backend its plugins register when it first picks a device; on a machine without
a TPU the probe fails and jax._src.xla_bridge logs "Unable to initialize backend 'tpu': ..." at
INFO. The command runs on whatever backend exists, so that line is demoted to DEBUG
(`--log-level DEBUG` still shows it). Where libtpu is installed (the test and tpu extras) but no
TPU is attached, jaxserve/platforms.py keeps JAX from probing it at all: libtpu's own stderr
lines cannot be filtered here. A backend JAX was told to use (JAX_PLATFORMS) that fails
still raises, with JAX's own message.
"""

from __future__ import annotations

import logging

JAX_BRIDGE_LOGGER = "jax._src.xla_bridge"
_PROBE_FAILURE = "Unable to initialize backend"


class BackendProbeFilter(logging.Filter):
  """Drops JAX's failed-backend-probe lines unless the logger is at DEBUG."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno <= logging.INFO and str(record.msg).startswith(_PROBE_FAILURE):
      return logging.getLogger(JAX_BRIDGE_LOGGER).getEffectiveLevel() <= logging.DEBUG
    return True


def configure_logging(level: str) -> None:
  logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  # basicConfig does nothing where an import already gave the root logger a handler (the engine
  # core process imports jax before configuring): its level must still be the one asked for
  logging.getLogger().setLevel(level)
  bridge = logging.getLogger(JAX_BRIDGE_LOGGER)
  if not any(isinstance(f, BackendProbeFilter) for f in bridge.filters):
    bridge.addFilter(BackendProbeFilter())
