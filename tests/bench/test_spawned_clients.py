"""SpawnedClients: processes that start together, answer once in job order, and fail loudly."""

import time

import pytest

from jaxserve.bench.spawned_clients import SpawnedClients


def _answer(start, progress, value):
  progress()
  return (value, start)


def _fail(start, progress, value):
  raise ValueError(f"job {value} broke")


def test_answers_in_job_order_with_progress():
  clients = SpawnedClients(_answer, [(10,), (20,)], "test client")
  start = clients.begin()
  seen = []
  assert clients.results(lambda: seen.append(1)) == [(10, start), (20, start)]  # one start
  assert len(seen) == 2 and start > time.monotonic() - 60


def test_a_process_that_raises_raises_in_the_parent():
  clients = SpawnedClients(_fail, [(7,)], "test client")
  clients.begin()
  with pytest.raises(RuntimeError, match="test client process 0 failed: ValueError: job 7 broke"):
    clients.results()
