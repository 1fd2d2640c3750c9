"""Load-generator processes started together: `bench serve`'s client processes
(client_processes.py) and the soak's (soak_workers.py).

`SpawnedClients(run, jobs, what)` spawns one process per job. Each settles its heap
(gc_pause.settle_heap: the collection it takes happens before the start), says it is ready and
waits. `begin()` sends every process one start time, START_DELAY_S ahead
(time.monotonic(): one clock for every process of the machine), so all of them have it, and have
set up what they send with, before it comes: a process that set up after the start would send
late, and at rate inf the first process to send would fill the server's batch with its streams.
Each process then answers `run(start, progress, *job)` once; `progress()` sends the parent a
PROGRESS message (a request done, for its progress bar). `results(on_progress)` waits for every
answer, in job order, and calls `on_progress` for each PROGRESS message meanwhile. A process that
raises or dies raises RuntimeError in the parent, naming `what`; its siblings are joined, and
killed if they do not end.

`run` is a module-level function (spawn pickles it by name) and a job a tuple of picklable values.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from jaxserve.bench.gc_pause import settle_heap

# from sending the start time to the start: every process has it and has made its HTTP client
# (0.05-0.25 s of its own: an SSL context, lazy imports) before the first send
START_DELAY_S = 0.5
PROGRESS = "done"
_READY = "ready"


@dataclass(frozen=True)
class _Failed:
  index: int
  error: str


def _serve(conn: Connection, index: int, run: Callable, job: tuple) -> None:
  """A spawned process: ready, the start time in, progress and its answer out."""
  try:
    settle_heap()
    conn.send(_READY)
    start = conn.recv()
    conn.send(run(start, lambda: conn.send(PROGRESS), *job))
  except BaseException as err:  # the parent reports it
    conn.send(_Failed(index, f"{type(err).__name__}: {err}"))
  finally:
    conn.close()


class SpawnedClients:
  def __init__(self, run: Callable, jobs: Sequence[tuple], what: str):
    context = multiprocessing.get_context("spawn")
    self._what = what
    self._conns: list[Connection] = []
    self._processes = []
    for index, job in enumerate(jobs):
      parent, child = context.Pipe()
      process = context.Process(target=_serve, args=(child, index, run, job), daemon=True)
      process.start()
      child.close()
      self._conns.append(parent)
      self._processes.append(process)
    try:
      for conn in self._conns:
        if self._receive(conn) != _READY:
          raise RuntimeError(f"a {what} process did not say it was ready")
    except BaseException:
      self._stop(0)
      raise

  def begin(self) -> float:
    """Sends every process the start time; returns it."""
    start = time.monotonic() + START_DELAY_S
    for conn in self._conns:
      conn.send(start)
    return start

  def results(self, on_progress: Callable[[], None] | None = None) -> list:
    """Every process's answer, in job order."""
    answers: dict[Connection, object] = {}
    try:
      waiting = list(self._conns)
      while waiting:
        for conn in wait(waiting):
          message = self._receive(conn)
          if message == PROGRESS:
            if on_progress is not None:
              on_progress()
          else:
            answers[conn] = message
            waiting.remove(conn)
    finally:
      self._stop(10)
    return [answers[conn] for conn in self._conns]

  def _receive(self, conn: Connection):
    try:
      message = conn.recv()
    except EOFError:
      raise RuntimeError(f"a {self._what} process exited before its result") from None
    if isinstance(message, _Failed):
      raise RuntimeError(f"{self._what} process {message.index} failed: {message.error}")
    return message

  def _stop(self, wait_s: float) -> None:
    for process in self._processes:
      process.join(wait_s)
      if process.is_alive():
        process.kill()
