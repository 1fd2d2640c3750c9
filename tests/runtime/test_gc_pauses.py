"""GcPauses: each collection's generation and duration, until closed, handed over outside the
collector (a collection inside code that holds a lock on_pause takes does not wait on it)."""

import gc
import threading

from jaxserve.runtime.gc_pauses import GcPauses


def test_each_collection_is_timed_until_closed():
  seen = []
  pauses = GcPauses(lambda generation, seconds: seen.append((generation, seconds))).start()
  try:
    pauses.start()  # a second start adds nothing
    gc.collect(1)
    gc.collect(2)
  finally:
    pauses.close()  # hands over what the delivery thread has not
  assert [g for g, _ in seen] == [1, 2] and all(s >= 0 for _, s in seen)
  gc.collect()
  assert len(seen) == 2  # closed: nothing more
  pauses.close()  # closing twice is harmless


def test_a_collection_while_the_thread_holds_on_pauses_lock_does_not_wait_on_it():
  """on_pause takes a non-reentrant lock, as prometheus_client's multiprocess metric values
  share one: a collection that runs while its thread holds that lock (inside a handler's
  observe) must not call on_pause there, or the thread waits on itself for ever."""
  lock = threading.Lock()
  seen = []

  def on_pause(generation: int, seconds: float) -> None:
    with lock:
      seen.append(generation)

  pauses = GcPauses(on_pause, delivery_period_s=0.01).start()
  done = threading.Event()

  def collect_holding_the_lock() -> None:
    with lock:
      gc.collect(1)
    done.set()

  threading.Thread(target=collect_holding_the_lock, daemon=True).start()
  try:
    assert done.wait(10), "the collection waited on a lock its own thread holds"
  finally:
    pauses.close()
  assert 1 in seen  # delivered once the lock was free
