"""GcPauses: each collection's generation and duration, until closed."""

import gc

from jaxserve.gc_pauses import GcPauses


def test_each_collection_is_timed_until_closed():
  seen = []
  pauses = GcPauses(lambda generation, seconds: seen.append((generation, seconds))).start()
  try:
    pauses.start()  # a second start adds nothing
    gc.collect(1)
    gc.collect(2)
  finally:
    pauses.close()
  assert [g for g, _ in seen] == [1, 2] and all(s >= 0 for _, s in seen)
  gc.collect()
  assert len(seen) == 2  # closed: nothing more
  pauses.close()  # closing twice is harmless
