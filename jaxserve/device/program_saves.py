"""Writing compiled step programs to the program store without slowing the requests served.

Serializing an executable holds the GIL for about a tenth of a second (an 8B's 83 programs took
about 8 s on an H200's host), which stalls the engine loop's steps. PendingSaves keeps the
programs a compiler compiled (add) and writes them either at once (save_all: before the engine
serves, e.g. a full warmup) or one at a time while the engine is idle (save_when_idle: once
`busy()` has been False for IDLE_BEFORE_SAVE_S, polled every IDLE_POLL_S; it stops when `stop`
is set, leaving the rest unwritten). device/program_compiler.py owns one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import jax

from jaxserve.device.program_store import ProgramStore

logger = logging.getLogger(__name__)

IDLE_BEFORE_SAVE_S = 1.0  # the engine idle this long before a program is written to the store
IDLE_POLL_S = 0.1


class PendingSaves:
  """Compiled programs not written to `store` yet, in the order they were compiled."""

  def __init__(self, store: ProgramStore):
    self.store = store
    self._pending: list[tuple[str, object, jax.stages.Compiled]] = []
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self._pending)

  def add(self, name: str, signature: object, compiled: jax.stages.Compiled) -> None:
    with self._lock:
      self._pending.append((name, signature, compiled))

  def _save_next(self) -> None:
    with self._lock:
      name, signature, compiled = self._pending.pop(0)
    self.store.save(name, signature, compiled)

  def save_all(self) -> None:
    """Writes every pending program now."""
    while self._pending:
      self._save_next()

  def save_when_idle(self, busy: Callable[[], bool], stop: threading.Event) -> None:
    """Writes the pending programs one at a time, each once `busy()` has been False for
    IDLE_BEFORE_SAVE_S; returns when none is left or `stop` is set."""
    if not self._pending:
      return
    count, start, idle_since = len(self._pending), time.perf_counter(), None
    while self._pending and not stop.is_set():
      now = time.perf_counter()
      if busy():
        idle_since = None
      elif idle_since is None:
        idle_since = now
      elif now - idle_since >= IDLE_BEFORE_SAVE_S:
        self._save_next()
        continue
      stop.wait(IDLE_POLL_S)
    if not self._pending:
      logger.info(
        "program store: %d programs written in the engine's idle moments, %.1f s after the "
        "last compilation",
        count,
        time.perf_counter() - start,
      )
