"""`jaxserve bench soak`'s report: a row per window (a minute by default) and the broken promises.

A row: calls ended in the window, output tokens per second, TTFT and TPOT p50 / p99 of its
streams, HTTP statuses (0: the connection broke), cancels, cut streams, and the last /metrics
and process samples of the window (KV pages in use, compilations, RSS of the server's processes,
the most device memory the engine held: /metrics' jaxserve_device_memory_used_bytes).

`problems` lists what the server promised and did not keep: a 5xx or a broken connection not
explained by a fault the soak injected (calls that ended within FAULT_GRACE_S of an API server kill;
a stalled reader is expected to be cut), a bad input answered with anything but a 4xx other than 429
and OpenAI's error body (what can never be served is never refused for load), a good call refused
with a 4xx other than 429 (the waiting queue is full: the expected answer to overload), a canary
that differs from the first (when they must match), KV pages still in use at the end, a compilation
after warm-up, RSS of the last window more than `rss_growth` above the first's, device memory of the
last window more than `device_memory_growth` above the first's, and a TTFT or TPOT quantile
(`latency_quantile`: 99, or 50 where neighbours share the cores and the tail measures them) of the
last window more than `latency_drift` above the first's (TPOT only when `overloaded`: past capacity
a TTFT is mostly the wait in the bounded queue, which fills and empties as API server kills cut
streams and cancels free places, so it measures the queue, not the server). "The first" is the
second window when there are three or more: in the first the load ramps up and the waiting queue
fills, which sets every later TTFT under overload. The last window is the last one the load ran in:
calls that end after the load stopped (the queue draining, with its long waits) fall in drain
windows, shown but not compared.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from jaxserve.bench.soak_client import SoakRecord

FAULT_GRACE_S = 5.0
DEVICE_MEMORY = "jaxserve_device_memory_used_bytes"


@dataclass(frozen=True)
class Sample:
  """One look at the server: /metrics values and the RSS of its processes."""

  time: float
  metrics: dict[str, float]
  rss_bytes: int


@dataclass
class SoakRun:
  start: float
  window_s: float
  records: list[SoakRecord] = field(default_factory=list)
  samples: list[Sample] = field(default_factory=list)
  kills: list[tuple[float, int]] = field(default_factory=list)  # (time, pid)
  final_metrics: dict[str, float] = field(default_factory=dict)
  compilations_at_start: float | None = None
  load_end: float | None = None  # when the load stopped; later windows hold the drain only
  request_rate: float | None = None  # the soak's arrivals per second
  client_cpu_shares: tuple[float, ...] = ()  # each client process's CPU time over wall time

  def window_of(self, time: float) -> int:
    return int((time - self.start) // self.window_s)


def _pct(values: list[float], q: float) -> float | None:
  return float(np.percentile(values, q)) if values else None


def window_rows(run: SoakRun) -> list[dict]:
  count = max([run.window_of(r.end) for r in run.records] + [0]) + 1
  rows = []
  for window in range(count):
    mine = [r for r in run.records if run.window_of(r.end) == window]
    samples = [s for s in run.samples if run.window_of(s.time) == window]
    ttft = [r.ttft for r in mine if r.ttft is not None]
    tpot = [r.tpot for r in mine if r.tpot is not None]
    last = samples[-1] if samples else None
    device = [s.metrics.get(DEVICE_MEMORY) for s in samples if s.metrics.get(DEVICE_MEMORY)]
    rows.append(
      {
        "window": window,
        "drain": run.load_end is not None and run.start + window * run.window_s >= run.load_end,
        "calls": len(mine),
        "tokens_per_s": sum(r.output_tokens for r in mine) / run.window_s,
        "ttft_p50": _pct(ttft, 50),
        "ttft_p99": _pct(ttft, 99),
        "tpot_p50": _pct(tpot, 50),
        "tpot_p99": _pct(tpot, 99),
        "statuses": dict(sorted(Counter(r.status for r in mine).items())),
        "cancelled": sum(r.cancelled for r in mine),
        "cut": sum(r.cut for r in mine),
        "kills": sum(1 for t, _ in run.kills if run.window_of(t) == window),
        "kv_pages_used": last.metrics.get("jaxserve_kv_pages_used") if last else None,
        "compilations": last.metrics.get("jaxserve_xla_compilations_total") if last else None,
        "rss_mib": last.rss_bytes / 2**20 if last and last.rss_bytes else None,
        "device_mib": max(device) / 2**20 if device else None,
      }
    )
  return rows


def _after_a_kill(run: SoakRun, record: SoakRecord) -> bool:
  return any(t <= record.end <= t + FAULT_GRACE_S for t, _ in run.kills)


def _since_kill(run: SoakRun, record: SoakRecord) -> str:
  """How long after the latest API server kill before the record ended ("" if none was)."""
  before = [t for t, _ in run.kills if t <= record.end]
  return f", {record.end - max(before):.2f} s after a kill" if before else ""


def _refused_as_promised(record: SoakRecord) -> bool:
  """A bad input's answer: a 4xx with OpenAI's error body, and never 429 (it can never be
  served, whatever the load)."""
  return 400 <= record.status < 500 and record.status != 429 and record.error_body_ok


def problems(
  run: SoakRun,
  *,
  canaries_must_match: bool,
  rss_growth: float,
  latency_drift: float,
  device_memory_growth: float = 0.05,
  latency_quantile: int = 99,
  overloaded: bool = False,
) -> list[str]:
  if latency_quantile not in (50, 99):
    raise ValueError(f"latency_quantile: {latency_quantile} (the rows hold p50 and p99)")
  found = []
  broken = [
    r for r in run.records if (r.status >= 500 or r.status == 0 or r.cut) and r.kind != "stalled"
  ]
  failed = [r for r in broken if not r.expect_4xx and not _after_a_kill(run, r)]
  for r in failed[:10]:
    found.append(
      f"{r.kind}: status {r.status}{' (cut)' if r.cut else ''} at {r.end - run.start:.2f} s"
      f"{_since_kill(run, r)}: {r.error}"
    )
  if len(failed) > 10:
    found.append(f"... and {len(failed) - 10} more failed calls")
  bad = [r for r in run.records if r.expect_4xx and not _refused_as_promised(r)]
  bad = [r for r in bad if not (r.status == 0 and _after_a_kill(run, r))]
  for r in bad[:10]:
    found.append(f"bad input answered {r.status} (OpenAI error body: {r.error_body_ok}): {r.error}")
  refused = [
    r for r in run.records if not r.expect_4xx and 400 <= r.status < 500 and r.status != 429
  ]
  for r in refused[:10]:
    found.append(f"{r.kind}: a good call refused with {r.status}: {r.error}")
  texts = [r.text for r in run.records if r.kind == "canary" and r.status == 200]
  if canaries_must_match and any(t != texts[0] for t in texts):
    found.append(f"canaries differ: {sum(t != texts[0] for t in texts)} of {len(texts)}")
  found += _end_state(run)
  rows = [r for r in window_rows(run) if r["calls"] and not r["drain"]]
  if len(rows) >= 2:
    first, last = rows[1 if len(rows) >= 3 else 0], rows[-1]  # the first window ramps up
    rss = (first["rss_mib"], last["rss_mib"])
    if rss[0] and rss[1] and rss[1] > rss[0] * (1 + rss_growth):
      found.append(f"RSS grew from {first['rss_mib']:.0f} MiB to {last['rss_mib']:.0f} MiB")
    device = (first["device_mib"], last["device_mib"])
    if device[0] and device[1] and device[1] > device[0] * (1 + device_memory_growth):
      found.append(f"device memory grew from {device[0]:.0f} MiB to {device[1]:.0f} MiB")
    kinds = ("tpot",) if overloaded else ("ttft", "tpot")  # overloaded: TTFT is the queue's wait
    for key in (f"{kind}_p{latency_quantile}" for kind in kinds):
      if first[key] and last[key] and last[key] > first[key] * (1 + latency_drift):
        found.append(f"{key} grew from {first[key] * 1e3:.1f} ms to {last[key] * 1e3:.1f} ms")
  return found


def _end_state(run: SoakRun) -> list[str]:
  found = []
  final = run.final_metrics
  if final.get("jaxserve_kv_pages_used", 0) != 0:
    found.append(f"{final['jaxserve_kv_pages_used']:.0f} KV pages still in use at the end")
  compiled = final.get("jaxserve_xla_compilations_total")
  if compiled is not None and run.compilations_at_start is not None:
    if compiled > run.compilations_at_start:
      found.append(f"{compiled - run.compilations_at_start:.0f} compilations after warm-up")
  return found


def summary(run: SoakRun) -> dict:
  records = run.records
  texts = [r.text for r in records if r.kind == "canary" and r.status == 200]
  return {
    "calls": len(records),
    "statuses": dict(sorted(Counter(r.status for r in records).items())),
    "bad_inputs": sum(r.expect_4xx for r in records),
    "cancelled": sum(r.cancelled for r in records),
    "cut": sum(r.cut for r in records),
    "cut_by_kills": sum(1 for r in records if (r.cut or r.status == 0) and _after_a_kill(run, r)),
    "kills": len(run.kills),
    "stalled_readers": sum(r.kind == "stalled" for r in records),
    "stalled_readers_cut": sum(r.kind == "stalled" and r.cut for r in records),
    "stalled_reader_statuses": dict(Counter(r.status for r in records if r.kind == "stalled")),
    "bad_input_statuses": dict(sorted(Counter(r.status for r in records if r.expect_4xx).items())),
    "canaries": len(texts),
    "canaries_agreeing": sum(t == texts[0] for t in texts) if texts else 0,
    "kv_pages_used_at_end": run.final_metrics.get("jaxserve_kv_pages_used"),
    "request_rate": run.request_rate,
    "client_cpu_shares": list(run.client_cpu_shares),
  }


def format_rows(rows: list[dict]) -> str:
  head = (
    "win  calls  tok/s  TTFT p50/p99 ms  TPOT p50/p99 ms  statuses            cncl cut kill  "
    "KV  comp  RSS MiB  dev MiB"
  )
  lines = [head]  # a window marked d: the load had stopped (the queue draining)
  for r in rows:
    lines.append(
      f"{r['window']:>2}{'d' if r['drain'] else ' '} {r['calls']:>5} {r['tokens_per_s']:>6.0f} "
      f"{_ms(r['ttft_p50']):>7}/{_ms(r['ttft_p99']):<7} "
      f"{_ms(r['tpot_p50']):>7}/{_ms(r['tpot_p99']):<7} "
      f"{_statuses(r['statuses']):<19} {r['cancelled']:>4} {r['cut']:>3} {r['kills']:>4} "
      f"{_num(r['kv_pages_used']):>3} {_num(r['compilations']):>5} {_num(r['rss_mib']):>8} "
      f"{_num(r.get('device_mib')):>8}"
    )
  return "\n".join(lines)


def _ms(value: float | None) -> str:
  return "-" if value is None else f"{value * 1e3:.0f}"


def _num(value: float | None) -> str:
  return "-" if value is None else f"{value:.0f}"


def _statuses(statuses: dict[int, int]) -> str:
  return " ".join(f"{k}:{v}" for k, v in statuses.items())
