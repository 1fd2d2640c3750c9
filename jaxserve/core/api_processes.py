"""The supervisor's API server processes: N slots, each running one process of run_api_process
on the shared listening socket, and each restarted when its process dies.

A slot's process that exits while the server is not stopping (killed, crashed, or drained by a
signal someone sent it alone) is reaped by the supervisor (core/supervisor.py), which tells the
core it is gone, and respawned after its slot's back-off (core/restart_backoff.py: 0.5 s doubling
to 30 s, reset by 60 s of health). The new process takes the next generation of the slot's client
identity (`api_identity`: api-0, then api-0.1, api-0.2...), so the core, which ignores a dead
client's late messages, never confuses it with its predecessor, and it accepts on the same
listening socket, which the supervisor keeps open for that until it stops. drain() cancels the
pending restarts and drains each running process (one SIGTERM each, however often it is called:
an API server's drain starts once); end_now() then ends their running responses at once
(END_NOW_SIGNAL, core/child_signals.py). Each process starts with SIGINT ignored: a terminal's
Ctrl-C is the supervisor's to act on.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jaxserve.core.child_signals import END_NOW_SIGNAL, start_ignoring_sigint
from jaxserve.core.info import ApiProcessArgs, ApiServerEntry
from jaxserve.core.restart_backoff import RestartBackoff

Target = Callable[[ApiServerEntry, ApiProcessArgs], None]  # supervisor.run_api_process


@dataclass
class ApiSlot:
  """One API server index: its current process (None while a restart is pending)."""

  index: int
  process: multiprocessing.process.BaseProcess | None = None
  args: ApiProcessArgs | None = None
  started_at: float = 0.0
  restart_at: float | None = None
  backoff: RestartBackoff = field(default_factory=RestartBackoff)
  drained: bool = False  # its process has had its SIGTERM

  @property
  def identity(self) -> str:
    return self.args.identity


@dataclass(frozen=True)
class ApiExit:
  """A reaped process: its slot, pid, exit code, life time and client identity."""

  slot: ApiSlot
  pid: int
  exitcode: int | None
  uptime_s: float
  identity: str

  @property
  def cause(self) -> str:
    return describe_exit(self.exitcode)


def describe_exit(code: int | None) -> str:
  """How a process ended, for the log: "exited with code 1", or "killed by SIGKILL" for
  multiprocessing's negative exit codes."""
  if code is not None and code < 0:
    try:
      return f"killed by {signal.Signals(-code).name}"
    except ValueError:
      return f"killed by signal {-code}"
  return f"exited with code {code}"


class ApiProcesses:
  """The slots, their processes and their restarts (the supervisor's main thread only)."""

  def __init__(
    self,
    count: int,
    make_args: Callable[[int, int], ApiProcessArgs],
    target: Target,
    entry: ApiServerEntry,
  ):
    self._slots = [ApiSlot(index) for index in range(count)]
    self._make_args = make_args  # (index, generation) -> ApiProcessArgs
    self._target, self._entry = target, entry
    self._context = multiprocessing.get_context("spawn")

  # -- processes ---------------------------------------------------------------------------
  def spawn(self, slot: ApiSlot) -> multiprocessing.process.BaseProcess:
    """Starts the slot's next process (generation = restarts so far)."""
    args = self._make_args(slot.index, slot.backoff.restarts)
    process = self._context.Process(
      target=self._target, name=f"jaxserve-api-{slot.index}", args=(self._entry, args)
    )
    start_ignoring_sigint(process)
    slot.process, slot.args, slot.restart_at, slot.drained = process, args, None, False
    slot.started_at = time.monotonic()
    return process

  @property
  def slots(self) -> list[ApiSlot]:
    return self._slots

  def running(self) -> list[multiprocessing.process.BaseProcess]:
    return [s.process for s in self._slots if s.process is not None and s.process.is_alive()]

  def sentinels(self) -> list[int]:
    return [s.process.sentinel for s in self._slots if s.process is not None]

  def reap(self, ready: list) -> list[ApiExit]:
    """The processes whose sentinel is in `ready`, joined and removed from their slots."""
    exits = []
    for slot in self._slots:
      process = slot.process
      if process is None or process.sentinel not in ready:
        continue
      process.join()
      exits.append(
        ApiExit(
          slot, process.pid, process.exitcode, time.monotonic() - slot.started_at, slot.identity
        )
      )
      slot.process = None
    return exits

  # -- restarts ----------------------------------------------------------------------------
  def schedule_restart(self, dead: ApiExit) -> float:
    """Plans the slot's restart after its back-off; the delay."""
    delay = dead.slot.backoff.next_delay(dead.uptime_s)
    dead.slot.restart_at = time.monotonic() + delay
    return delay

  def seconds_to_next_restart(self) -> float | None:
    """None when no restart is pending."""
    due = [s.restart_at for s in self._slots if s.restart_at is not None]
    return max(0.0, min(due) - time.monotonic()) if due else None

  def restart_due(self, stopping: Callable[[], bool]) -> list[ApiSlot]:
    """Respawns each slot whose back-off has passed (none once stopping); the slots."""
    now, started = time.monotonic(), []
    for slot in self._slots:
      if slot.restart_at is not None and slot.restart_at <= now and not stopping():
        self.spawn(slot)
        started.append(slot)
    return started

  # -- stopping ----------------------------------------------------------------------------
  def drain(self) -> None:
    """SIGTERM to every running process that has not had it; no restart happens after this."""
    for slot in self._slots:
      slot.restart_at = None
      if slot.process is not None and slot.process.is_alive() and not slot.drained:
        slot.drained = True
        _send(slot.process, signal.SIGTERM)

  def end_now(self) -> None:
    """Drains, and tells every running process to end its running responses now."""
    self.drain()
    for process in self.running():
      _send(process, END_NOW_SIGNAL)

  def terminate(self, timeout_s: float) -> None:
    """Whatever still runs gets SIGTERM and `timeout_s` to exit."""
    for process in self.running():
      process.terminate()
      process.join(timeout_s)


def _send(process: multiprocessing.process.BaseProcess, sig: int) -> None:
  try:
    os.kill(process.pid, sig)
  except ProcessLookupError:  # it exited (and was reaped) since it was seen alive
    pass
