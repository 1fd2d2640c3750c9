"""The supervisor's engine core processes: one, or data_parallel_size of them on one host, each
on its own devices (core/device_groups.py plans them; the supervisor never imports jax).

start() spawns every core at once (they build and warm up side by side) and waits until each
serves; if one fails or a stop signal comes, the others are stopped before it raises. Core i's
address is ApiProcessArgs' i-th (its engine index, vLLM's `engine` label). The supervisor waits
on the live cores' sentinels; reap() takes the ones that died out of the live set, and the
control sockets (one DEALER per core, identity "supervisor") tell each live core that an API
server process is gone (ClientGone), so it aborts that client's requests.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

import msgspec
import zmq

from jaxserve.config import EngineConfig
from jaxserve.core.device_groups import DeviceGroup, detect_accelerators, plan_device_groups
from jaxserve.core.info import CoreInfo
from jaxserve.core.messages import ClientGone
from jaxserve.core.process import (
  CoreHandle,
  spawn_core_process,
  stop_starting,
  wait_until_serving,
)

logger = logging.getLogger(__name__)


def device_groups(config: EngineConfig) -> list[DeviceGroup | None]:
  """Each core's devices: [None] (every device of the process, as ever) with one core."""
  if config.data_parallel_size == 1:
    return [None]
  accelerators = detect_accelerators(os.environ)
  return list(
    plan_device_groups(
      config.data_parallel_size, config.tensor_parallel_size, accelerators, os.environ
    )
  )


class EngineCores:
  """The running cores, by engine index, and which of them are still alive."""

  def __init__(self, handles: list[CoreHandle]):
    self.handles = handles
    self.live = set(range(len(handles)))
    self._context: zmq.Context | None = None
    self._controls: list[zmq.Socket] = []

  @classmethod
  def start(
    cls, config: EngineConfig, log_level: str, stop_requested: Callable[[], bool]
  ) -> EngineCores:
    """Every core serving; raises as start_core_process does (the first failure's error)."""
    groups = device_groups(config)
    starting = [spawn_core_process(config, log_level, group=group) for group in groups]
    handles: list[CoreHandle] = []
    try:
      for pending in starting:
        handles.append(wait_until_serving(pending, stop_requested))
    except BaseException:
      for pending in starting[len(handles) :]:
        stop_starting(pending)
      for handle in handles:
        handle.stop()
      raise
    for group, handle in zip(groups, handles, strict=True):
      if group is not None:
        logger.info("%s: pid %d", group.describe(), handle.process.pid)
    return cls(handles)

  @property
  def info(self) -> CoreInfo:
    return self.handles[0].info

  @property
  def addresses(self) -> list[str]:
    return [h.address for h in self.handles]

  def describe_pids(self) -> str:
    """ "engine core pid P" for one core, "engine core pids P0,P1" for several."""
    pids = ",".join(str(h.process.pid) for h in self.handles)
    return f"engine core pid{'s' if len(self.handles) > 1 else ''} {pids}"

  def sentinels(self) -> dict[int, int]:
    """The live cores' process sentinels -> engine index."""
    return {self.handles[i].process.sentinel: i for i in self.live}

  def reap(self, ready: list) -> list[int]:
    """The live cores whose sentinel is in `ready`: joined, no longer live; their indices."""
    dead = [i for sentinel, i in self.sentinels().items() if sentinel in ready]
    for index in dead:
      self.handles[index].process.join()
      self.live.discard(index)
    return sorted(dead)

  def connect(self) -> None:
    """The control sockets (after start, before client_gone)."""
    self._context = zmq.Context()
    for handle in self.handles:
      control = self._context.socket(zmq.DEALER)
      control.setsockopt(zmq.IDENTITY, b"supervisor")
      control.setsockopt(zmq.LINGER, 1000)
      control.connect(handle.address)
      self._controls.append(control)

  def client_gone(self, identity: str) -> None:
    """Tells every live core that the client `identity` is gone."""
    message = msgspec.msgpack.encode(ClientGone(identity))
    for index in self.live:
      self._controls[index].send(message)

  def close(self) -> None:
    for control in self._controls:
      control.close()
    if self._context is not None:
      self._context.term()

  def stop(self, timeout_s: float) -> list[int | None]:
    """One SIGTERM to every core still running (all at once: they stop side by side), then
    wait; their exit codes by engine index."""
    for handle in self.handles:
      if handle.process.is_alive():
        os.kill(handle.process.pid, signal.SIGTERM)
    return [handle.wait_stopped(timeout_s) for handle in self.handles]
