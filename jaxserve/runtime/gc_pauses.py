"""GcPauses: how long CPython's cycle collector stops this process, one collection at a time.

A serving process's event loop (an API server) or step loop (the engine core) does nothing while
the collector runs; a full (generation 2) collection walks every tracked object, tens of
milliseconds in a large heap, and every stream of the process then gets the steps that ended
meanwhile back to back. The serving processes freeze their start-up heap (gc.freeze) so the
collector skips it; this watches what is left. `start()` adds a gc.callbacks entry that times
each collection; `close()` removes it (gc.callbacks is the interpreter's list: the owner of a
process's serving loop starts one and closes it). Pure Python.

Delivery. A collection runs inside whatever code allocated last, which may hold a lock: in
prometheus_client's multiprocess mode (the API servers' metrics) every metric value of the
process shares one non-reentrant lock, and a collection that starts while a handler's `observe`
holds it would deadlock if the callback observed the pause itself (an API server stopped
answering that way, its streams and its drain stuck). So the callback only appends (generation,
seconds) to a queue, and a thread of this object's own hands each pause to `on_pause` every
DELIVERY_PERIOD_S (and `close()` hands over what is left): `on_pause` never runs inside the
collector, and may take any lock.
"""

from __future__ import annotations

import collections
import gc
import threading
import time
from collections.abc import Callable

DELIVERY_PERIOD_S = 0.5


class GcPauses:
  def __init__(
    self, on_pause: Callable[[int, float], None], delivery_period_s: float = DELIVERY_PERIOD_S
  ):
    self._on_pause = on_pause
    self._period = delivery_period_s
    self._started_at: float | None = None
    self._pending: collections.deque[tuple[int, float]] = collections.deque()
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def _callback(self, phase: str, info: dict) -> None:
    """Inside the collector: time it and queue the pause (a deque append takes no lock)."""
    if phase == "start":
      self._started_at = time.perf_counter()
    elif self._started_at is not None:
      self._pending.append((int(info["generation"]), time.perf_counter() - self._started_at))
      self._started_at = None

  def start(self) -> GcPauses:
    if self._callback not in gc.callbacks:
      gc.callbacks.append(self._callback)
    if self._thread is None:
      self._stop.clear()
      self._thread = threading.Thread(target=self._deliver_loop, name="gc-pauses", daemon=True)
      self._thread.start()
    return self

  def flush(self) -> None:
    """Hands every queued pause to on_pause, oldest first (on the calling thread)."""
    while True:
      try:
        generation, seconds = self._pending.popleft()
      except IndexError:
        return
      self._on_pause(generation, seconds)

  def close(self) -> None:
    if self._callback in gc.callbacks:
      gc.callbacks.remove(self._callback)
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      self._thread = None
    self.flush()

  def _deliver_loop(self) -> None:
    while not self._stop.wait(self._period):
      self.flush()
