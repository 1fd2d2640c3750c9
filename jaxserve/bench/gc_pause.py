"""The load generators' cycle collector, kept out of the timed region.

A client process that streams hundreds of responses allocates millions of objects (chunks, their
parsed JSON, the records' gap lists); CPython's cycle collector then runs full (generation 2)
collections over the whole heap, which stop the event loop for tens of milliseconds (measured in
`bench serve`'s one client process on tiny-random, 400 streams of 200 tokens: one of 87-91 ms
inside the run). Every stream of that process then reads the chunks that arrived meanwhile back
to back, as if the server had sent them in pairs.

`settle_heap()` collects once and freezes what exists (call it before the start time is fixed:
it takes that long itself); `no_cycle_collection()` disables the collector for the run
(reference counting still frees everything that is not in a cycle) and restores it after. Used
by bench serve's client processes (client_processes.py, serve_client.py) and the soak's
(soak_workers.py).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def settle_heap() -> None:
  gc.collect()
  gc.freeze()


@contextlib.contextmanager
def no_cycle_collection() -> Iterator[None]:
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was_enabled:
      gc.enable()
