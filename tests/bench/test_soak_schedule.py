"""The soak's schedule: the same calls from the same spec, so client processes can share it out."""

import itertools

import pytest

from jaxserve.bench.soak_catalogue import ServedModel
from jaxserve.bench.soak_schedule import ScheduleSpec, calls

MODEL = ServedModel("m", 256, (5, 6, 7))


def spec(**changes) -> ScheduleSpec:
  base = dict(
    model=MODEL,
    rate=50.0,
    duration_s=20.0,
    seed=3,
    max_tokens=16,
    cancel_share=0.1,
    bad_share=0.05,
    canary_every_s=2.0,
  )
  return ScheduleSpec(**{**base, **changes})


def test_the_draw_is_a_function_of_the_spec_and_the_shares_partition_it():
  whole = list(calls(spec()))
  assert whole == list(calls(spec()))
  shares = [list(itertools.islice(calls(spec()), k, None, 3)) for k in range(3)]
  assert sorted(c for share in shares for c in share) == sorted(whole)
  assert sum(map(len, shares)) == len(whole)


def test_times_canaries_and_shares_of_the_mix():
  whole = list(calls(spec()))
  times = [at for at, _ in whole]
  assert times == sorted(times) and 0 < times[0] and times[-1] < 20.0
  assert 800 < len(whole) < 1200  # 50 a second for 20 s
  canaries = [at for at, request in whole if request.kind == "canary"]
  assert len(canaries) == 10  # the first arrival after each 2 s mark
  bad = sum(request.expect_4xx for _, request in whole)
  cancels = sum(request.cancel_after is not None for _, request in whole)
  assert 0.02 < bad / len(whole) < 0.09 and 0.05 < cancels / len(whole) < 0.15
  assert all(request.stream for _, request in whole if request.cancel_after is not None)


def test_a_rate_of_zero_is_refused():
  with pytest.raises(ValueError, match="rate"):
    next(calls(spec(rate=0.0)))
