"""The load generators' cycle collector: off for the run, restored after, the heap settled first."""

import gc

from jaxserve.bench.gc_pause import no_cycle_collection, settle_heap


def test_the_collector_is_off_inside_and_restored_after():
  assert gc.isenabled()
  with no_cycle_collection():
    assert not gc.isenabled()
  assert gc.isenabled()
  gc.disable()
  try:
    with no_cycle_collection():
      assert not gc.isenabled()
    assert not gc.isenabled()  # it was off before: it stays off
  finally:
    gc.enable()


def test_settling_freezes_what_exists():
  cycle = []
  cycle.append(cycle)
  try:
    settle_heap()
    assert gc.get_freeze_count() > 0
  finally:
    gc.unfreeze()
