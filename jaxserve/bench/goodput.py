"""Goodput: the rate of requests that meet every service-level objective (vLLM's --goodput).

SLOs are given as `METRIC:MILLISECONDS` with METRIC one of ttft, tpot, e2el (e.g.
`--goodput ttft:500 tpot:50`); a request meets them when each of its values is at most the
objective. A request with one output token has no TPOT and meets a TPOT objective.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jaxserve.bench.latency_stats import RequestRecord

GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
  """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
  slos: dict[str, float] = {}
  for item in items:
    name, sep, value = item.partition(":")
    if not sep or name not in GOODPUT_METRICS:
      raise ValueError(
        f"goodput: {item!r} is not METRIC:MS with METRIC one of {', '.join(GOODPUT_METRICS)}"
      )
    try:
      slos[name] = float(value)
    except ValueError as err:
      raise ValueError(f"goodput: {item!r}: {value!r} is not a number of milliseconds") from err
    if not slos[name] > 0:
      raise ValueError(f"goodput: {item!r}: the objective must be > 0 ms")
  return slos


def meets_slos(record: RequestRecord, slos_ms: Mapping[str, float]) -> bool:
  if not record.success:
    return False
  values = {"ttft": record.ttft, "tpot": record.tpot, "e2el": record.e2e}
  return all(values[name] is None or 1e3 * values[name] <= limit for name, limit in slos_ms.items())
