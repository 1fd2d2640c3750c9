"""bench serve's verdicts on its own client processes (jaxserve/bench/client_usage.py), on
hand-made usages: busy for 90% of its run is a bottleneck; 5% or more of 100 or more chunk gaps
under 1 ms is pairing (the GPU burst's process that filled the server's first batch: 73% of its
gaps under 1 ms at 65% busy), whichever way it came about; the most streams a process had open
at once, from its records' spans."""

from __future__ import annotations

from jaxserve.bench.client_usage import (
  ClientUsage,
  bottleneck_warnings,
  paired_warnings,
  peak_streams,
)
from jaxserve.bench.latency_stats import RequestRecord


def _usage(process: int, busy: float, gaps: int, small: int) -> ClientUsage:
  return ClientUsage(process, 250, 10.0, busy * 10.0, busy * 10.0, gaps, small, 0.0112, 0.0165)


def test_busy_and_paired_are_two_verdicts():
  usages = [
    _usage(0, 0.65, 63_750, 46_537),  # the GPU run's: paired, not busy
    _usage(1, 0.38, 63_750, 77),  # 0.1%: one per step
    _usage(2, 0.95, 63_750, 0),  # busy, not paired
    _usage(3, 0.20, 40, 40),  # too few gaps to say
  ]
  assert [u.paired for u in usages] == [True, False, False, False]
  assert [u.bottleneck for u in usages] == [False, False, True, False]
  assert [w.split(" ")[3] for w in paired_warnings(usages)] == ["0"]
  (paired,) = paired_warnings(usages)
  assert "read 73% of its chunks under 1 ms" in paired and "11.20 / 16.50 ms" in paired
  assert [w.split(" ")[3] for w in bottleneck_warnings(usages, cores=16)] == ["2"]
  assert _usage(4, 0.3, 100, 5).paired and not _usage(5, 0.3, 100, 4).paired  # the 5% line


def _span(first: float, last: float, success: bool = True, queued: float = 0.5) -> RequestRecord:
  """A request sent `queued` s before its first chunk at `first`, its last chunk at `last`."""
  start = first - queued
  return RequestRecord(
    success, 8, 8, output_tokens=8, ttft=queued, e2e=last - start, start_time=start
  )


def test_peak_streams_counts_overlapping_streaming_spans():
  # streaming [0, 3], [1, 2], [1.5, 4]: three in [1.5, 2]; [3, 5] starts as [0, 3] ends
  records = [_span(0.0, 3.0), _span(1.0, 2.0), _span(1.5, 4.0), _span(3.0, 5.0)]
  assert peak_streams(records) == 3
  assert peak_streams([_span(0.0, 1.0), _span(1.0, 2.0)]) == 1  # one ends as the next starts
  assert peak_streams([_span(0.0, 5.0), _span(1.0, 2.0, success=False)]) == 1  # failed
  # all sent at once, queued 0 / 2 / 4 s: streaming one after another, never together
  assert peak_streams([_span(2.0 * k, 2.0 * k + 1.5, queued=2.0 * k + 0.1) for k in range(3)]) == 1
  assert peak_streams([]) == 0
