"""GcPauses: how long CPython's cycle collector stops this process, one collection at a time.

A serving process's event loop (an API server) or step loop (the engine core) does nothing while
the collector runs; a full (generation 2) collection walks every tracked object, tens of
milliseconds in a large heap, and every stream of the process then gets the steps that ended
meanwhile back to back. The serving processes freeze their start-up heap (gc.freeze) so the
collector skips it; this watches what is left. `start()` adds a gc.callbacks entry that times
each collection and hands (generation, seconds) to `on_pause`; `close()` removes it (gc.callbacks
is the interpreter's list: the owner of a process's serving loop starts one and closes it).
Pure Python.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


class GcPauses:
  def __init__(self, on_pause: Callable[[int, float], None]):
    self._on_pause = on_pause
    self._started_at: float | None = None

  def _callback(self, phase: str, info: dict) -> None:
    if phase == "start":
      self._started_at = time.perf_counter()
    elif self._started_at is not None:
      self._on_pause(int(info["generation"]), time.perf_counter() - self._started_at)
      self._started_at = None

  def start(self) -> GcPauses:
    if self._callback not in gc.callbacks:
      gc.callbacks.append(self._callback)
    return self

  def close(self) -> None:
    if self._callback in gc.callbacks:
      gc.callbacks.remove(self._callback)
