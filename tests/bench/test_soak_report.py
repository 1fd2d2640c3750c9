"""The soak's report rules (jaxserve/bench/soak_report.py) on hand-made runs: each broken promise
is named, and what the soak itself caused (a call cut by an API server kill, a 429 under
overload) is not."""

from __future__ import annotations

import dataclasses

import pytest

from jaxserve.bench.soak_client import SoakRecord
from jaxserve.bench.soak_report import Sample, SoakRun, problems, window_rows

RULES = dict(canaries_must_match=True, rss_growth=0.2, latency_drift=1.0)


def _stream(end: float, tpot: float, status: int = 200, **extra) -> SoakRecord:
  return SoakRecord(
    "stream", end - 1.0, end, status, ttft=0.05, tpot=tpot, output_tokens=8, **extra
  )


def _run(records: list[SoakRecord], rss: tuple[int, int] = (100, 100), **extra) -> SoakRun:
  samples = [Sample(5.0, {}, rss[0] << 20), Sample(15.0, {}, rss[1] << 20)]
  final = {"jaxserve_kv_pages_used": 0.0, "jaxserve_xla_compilations_total": 7.0}
  return SoakRun(
    0.0, 10.0, records, samples, final_metrics=final, compilations_at_start=7.0, **extra
  )


def _steady(tail_tpot: float = 0.01) -> list[SoakRecord]:
  """Two 10 s windows of 20 streams at 10 ms a token; the last window's slowest stream at
  `tail_tpot`."""
  first = [_stream(1.0 + i * 0.4, 0.01) for i in range(20)]
  last = [_stream(11.0 + i * 0.4, 0.01) for i in range(19)] + [_stream(18.9, tail_tpot)]
  return first + last


def test_a_steady_run_keeps_every_promise():
  run = _run(_steady())
  assert [row["calls"] for row in window_rows(run)] == [20, 20]
  assert problems(run, **RULES) == []


def test_a_slower_tail_is_drift_at_p99_but_not_at_the_median():
  run = _run(_steady(tail_tpot=0.5))
  # p99 of 20 values interpolates at rank 0.99 * 19 = 18.81: 10 + 0.81 * (500 - 10) = 406.9 ms
  assert problems(run, **RULES) == ["tpot_p99 grew from 10.0 ms to 406.9 ms"]
  assert problems(run, **RULES, latency_quantile=50) == []
  with pytest.raises(ValueError, match="latency_quantile"):
    problems(run, **RULES, latency_quantile=90)


def test_a_5xx_is_excused_only_right_after_a_kill():
  records = _steady() + [_stream(12.0, 0.01, status=0, cut=True), _stream(3.0, 0.01, status=502)]
  records.append(_stream(17.0, 0.01, status=0, cut=True))  # past FAULT_GRACE_S: not excused
  found = problems(_run(records, kills=[(11.0, 123)]), **RULES)
  assert found == [
    "stream: status 502 at 3.00 s: ",
    "stream: status 0 (cut) at 17.00 s, 6.00 s after a kill: ",
  ]


def test_bad_inputs_good_calls_refused_canaries_pages_compilations_and_rss():
  records = _steady() + [
    SoakRecord("bad", 2.0, 2.1, 200, expect_4xx=True),  # a bad input answered 200
    SoakRecord("bad", 2.0, 2.1, 400, expect_4xx=True, error_body_ok=True),  # as promised
    SoakRecord("bad", 2.0, 2.1, 429, expect_4xx=True, error_body_ok=True),  # never servable
    SoakRecord("stream", 2.0, 2.1, 429),  # overload: the promised answer
    SoakRecord("stream", 2.0, 2.1, 404, error="no such model"),
    SoakRecord("canary", 2.0, 3.0, 200, text="a b c"),
    SoakRecord("canary", 12.0, 13.0, 200, text="a b d"),
  ]
  run = _run(records, rss=(100, 130))
  run.final_metrics.update(jaxserve_kv_pages_used=3.0, jaxserve_xla_compilations_total=9.0)
  assert problems(run, **RULES) == [
    "bad input answered 200 (OpenAI error body: False): ",
    "bad input answered 429 (OpenAI error body: True): ",
    "stream: a good call refused with 404: no such model",
    "canaries differ: 1 of 2",
    "3 KV pages still in use at the end",
    "2 compilations after warm-up",
    "RSS grew from 100 MiB to 130 MiB",
  ]


def test_the_drain_after_the_load_stops_is_shown_but_not_compared():
  """Calls that end after the load stopped waited in the queue: their window is not the last."""
  drain = [_stream(21.0 + i, 0.2) for i in range(5)]
  run = _run(_steady() + drain, load_end=20.0)
  assert [row["drain"] for row in window_rows(run)] == [False, False, True]
  assert problems(run, **RULES) == []
  run.load_end = None  # without the end of the load the drain would read as drift
  assert problems(run, **RULES) == ["tpot_p99 grew from 10.0 ms to 200.0 ms"]


def test_the_ramp_window_is_not_the_baseline():
  """Under overload the first window's calls found the queue empty; the second window is the
  baseline from three windows on, and drift past it is still found."""
  ramp = [_stream(1.0 + i * 0.4, 0.01) for i in range(20)]
  full = [
    SoakRecord("stream", t - 1.0, t, 200, ttft=0.5, tpot=0.01, output_tokens=8)
    for t in [11.0 + i * 0.4 for i in range(20)] + [21.0 + i * 0.4 for i in range(20)]
  ]
  assert problems(_run(ramp + full), **RULES) == []
  slower = [dataclasses.replace(r, ttft=1.5) for r in full[20:]]
  assert problems(_run(ramp + full[:20] + slower), **RULES) == [
    "ttft_p99 grew from 500.0 ms to 1500.0 ms"
  ]


def test_overloaded_runs_compare_tpot_only():
  """Past capacity the queue's wait sets TTFT: a full queue in the last window is no drift."""
  records = _steady() + [SoakRecord("stream", 18.0, 19.0, 200, ttft=0.9, tpot=0.01)] * 20
  assert problems(_run(records), **RULES) == ["ttft_p99 grew from 50.0 ms to 900.0 ms"]
  assert problems(_run(records), **RULES, overloaded=True) == []
