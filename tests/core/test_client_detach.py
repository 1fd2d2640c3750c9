"""CoreClient.detach() (core/client.py) returns however the core's end of the connection comes
and goes. libzmq's I/O thread sends each monitor event (the core's end closing) to the monitor's
PAIR socket with a blocking send, holding the socket's monitor lock: an event that comes once that
PAIR is closed blocks the I/O thread for ever, and disable_monitor() and term() with it. The
client used to close the PAIR first and stop the monitor after sending ClientGone: an API server
whose core exited on that ClientGone before disable_monitor() ran hung in detach (seen under load:
`jaxserve serve --api-server-count 4`, stopped by SIGTERM, never exited).

The core here is a bare ROUTER at an ipc:// address speaking the core's messages (a StepOutputs
with zero stats answers the Hello), on a thread of its own; each scenario runs in a process of
its own (a hung detach freezes its whole process)."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

import msgspec
import zmq

from jaxserve.core.client import CoreClient, _zero_stats
from jaxserve.core.messages import ClientGone, StepOutputs, ToCore
from jaxserve.core.router import bind_router, core_address, remove_address
from jaxserve.tokenizer.byte_tokenizer import byte_level_tokenizer

DETACH_TIMEOUT_S = 30.0  # a spawned child imports jaxserve first: seconds on a loaded machine


class _Core:
  """A ROUTER at `address` that answers each Hello with a StepOutputs and closes (the core
  exiting) on a ClientGone if `exit_on_goodbye`, else when stop() is called. `connected` is set
  once a client has connected (its monitor's EVENT_ACCEPTED)."""

  def __init__(self, address: str, exit_on_goodbye: bool):
    self._exit_on_goodbye = exit_on_goodbye
    self._stop = threading.Event()
    self.connected = threading.Event()
    self._context = zmq.Context()
    self._socket = bind_router(self._context, address)
    self._monitor = self._socket.get_monitor_socket(zmq.EVENT_ACCEPTED)
    self._thread = threading.Thread(target=self._serve, daemon=True)
    self._thread.start()

  def _serve(self) -> None:
    poller = zmq.Poller()
    poller.register(self._socket, zmq.POLLIN)
    poller.register(self._monitor, zmq.POLLIN)
    try:
      while not self._stop.is_set():
        ready = dict(poller.poll(10))
        if self._monitor in ready:
          self._monitor.recv_multipart()
          self.connected.set()
        if self._socket in ready and not self._answer():
          return
    finally:
      self._socket.disable_monitor()  # before its PAIR closes (the module docstring)
      self._monitor.close(linger=0)
      self._socket.close(linger=0)
      self._context.term()

  def _answer(self) -> bool:
    """Answers one message; False on a ClientGone it exits on."""
    identity, body = self._socket.recv_multipart()
    message = msgspec.msgpack.decode(body, type=ToCore)
    if isinstance(message, ClientGone):
      return not self._exit_on_goodbye
    hello = StepOutputs([], [], _zero_stats(), 0, 1)
    self._socket.send_multipart([identity, msgspec.msgpack.encode(hello)])
    return True

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(5)


def _scenario_returns(scenario) -> bool:
  """Whether `scenario` returns within DETACH_TIMEOUT_S, run in a process of its own: a hung
  detach holds the GIL inside libzmq (disable_monitor), freezing every thread of its process."""
  process = multiprocessing.get_context("spawn").Process(target=scenario, daemon=True)
  process.start()
  process.join(DETACH_TIMEOUT_S)
  if process.is_alive():
    process.kill()
    process.join()
    return False
  assert process.exitcode == 0, f"the scenario failed: exit code {process.exitcode}"
  return True


def _detach_as_the_core_exits() -> None:
  """The drain: the API server says ClientGone and the core exits on it (its last client's)."""
  for _ in range(3):  # the old client hung at the first attempt nearly every time
    address = core_address()
    core = _Core(address, exit_on_goodbye=True)

    async def run(address: str = address) -> None:
      client = CoreClient(address, byte_level_tokenizer(), identity="api-0")
      await client.attach()
      assert client.alive
      await client.detach()

    try:
      asyncio.run(run())
    finally:
      core.stop()
      remove_address(address)


def _detach_after_a_core_came_and_went() -> None:
  """Deterministic: the first core's end closed (the watcher saw it and closed the PAIR), the
  DEALER reconnected to a second core at the same address, and that one's end closed too: an
  event after the PAIR was closed (the old client hung here every time)."""
  address = core_address()

  async def run() -> None:
    first = _Core(address, exit_on_goodbye=False)
    client = CoreClient(address, byte_level_tokenizer(), identity="api-0")
    await client.attach()
    first.stop()
    while client.alive:  # the watcher saw the first core's end close
      await asyncio.sleep(0.01)
    second = _Core(address, exit_on_goodbye=False)
    while not second.connected.is_set():  # the DEALER reconnected (it says nothing)
      await asyncio.sleep(0.01)
    second.stop()
    await asyncio.sleep(0.2)  # its end closed: the monitor's event, if a monitor was left
    await client.detach()

  try:
    asyncio.run(run())
  finally:
    remove_address(address)


def test_detach_returns_when_the_core_exits_on_the_goodbye():
  assert _scenario_returns(_detach_as_the_core_exits), "detach() hung"


def test_detach_returns_after_the_core_went_away_and_another_came_and_went():
  assert _scenario_returns(_detach_after_a_core_came_and_went), "detach() hung"
