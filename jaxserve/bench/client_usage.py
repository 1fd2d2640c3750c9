"""What `jaxserve bench serve`'s own client processes cost, and whether they limited the run.

Each client process measures itself over its run (UsageMeter, read before the event loop shuts
its worker threads down): its CPU time (user + system, all threads: resource.getrusage), and,
where Linux's /proc/self/task/*/schedstat exists, how long its threads were on a CPU or waiting
for one (runnable), summed over threads and capped at the run's wall time: the event loop and
the threads it waits on (name resolution). A client busy for BOTTLENECK_SHARE of the run, or
whose CPU time reached that share of one core, had no idle time left: chunks waited for it, so
the latencies it measured include its own queueing and its throughput may be its own limit, not
the server's. The report then warns.

It also counts each process's chunk gaps (the ITLs: gaps between content chunks of a stream)
under SMALL_GAP_S: chunks that arrived back to back, a server sending several steps at once or a
client reading late; and its ITL and TPOT medians, so a process whose streams arrive in pairs
(ITL median far under TPOT median) shows, with the most of its streams that were streaming at
once, from first chunk to last (a process that holds most of the server's running batch parses
that many streams' chunks every step), its median time to first chunk, and how late its latest
request left against its send time (a process that sent late finds the server's batch taken by
the others' streams). A process with PAIRED_SHARE or more of its gaps under
SMALL_GAP_S gets a warning of its own: a client process can fall behind in bursts (every stream's
chunk of a step at once) while its average busy share stays low, and its ITLs are then its own.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jaxserve.bench.latency_stats import RequestRecord

BOTTLENECK_SHARE = 0.9
SMALL_GAP_S = 1e-3
PAIRED_SHARE = 0.05  # of a process's chunk gaps under SMALL_GAP_S: its chunks came in pairs
MIN_GAPS = 100  # fewer gaps say nothing of pairing
_TASKS = Path("/proc/self/task")


def _cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _busy_seconds_by_thread() -> dict[str, float] | None:
  """Each thread's time on a CPU plus its time waiting for one (schedstat's first two fields,
  ns), or None where unknown."""
  try:
    tasks = list(_TASKS.iterdir())
  except OSError:
    return None
  busy = {}
  for task in tasks:
    try:
      on_cpu, waiting = (task / "schedstat").read_text().split()[:2]
    except (OSError, ValueError):
      continue  # the thread ended, or no schedstat
    busy[task.name] = (int(on_cpu) + int(waiting)) / 1e9
  return busy or None


@dataclass(frozen=True)
class ClientUsage:
  """One client process over its run. busy_s: its threads on a CPU or waiting for one, summed
  (None where unknown)."""

  process: int
  requests: int
  wall_s: float
  cpu_s: float
  busy_s: float | None
  gaps: int
  small_gaps: int
  itl_p50_s: float | None = None  # median gap between a stream's chunks
  tpot_p50_s: float | None = None  # median time per output token after the first
  peak_streams: int = 0  # the most of its streams streaming at once (first chunk to last)
  ttft_p50_s: float | None = None
  send_lag_max_s: float | None = None  # the latest send against its scheduled time

  @property
  def cpu_share(self) -> float:
    """CPU time over wall time: the share of one core it used."""
    return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

  @property
  def busy_share(self) -> float | None:
    if self.busy_s is None or self.wall_s <= 0:
      return None
    return min(1.0, self.busy_s / self.wall_s)

  @property
  def small_gap_fraction(self) -> float:
    return self.small_gaps / self.gaps if self.gaps else 0.0

  @property
  def bottleneck(self) -> bool:
    return max(self.cpu_share, self.busy_share or 0.0) >= BOTTLENECK_SHARE

  @property
  def paired(self) -> bool:
    return self.gaps >= MIN_GAPS and self.small_gap_fraction >= PAIRED_SHARE

  def to_dict(self) -> dict:
    return {
      "process": self.process,
      "requests": self.requests,
      "wall_s": self.wall_s,
      "cpu_s": self.cpu_s,
      "cpu_share": self.cpu_share,
      "busy_share": self.busy_share,
      "gaps": self.gaps,
      "small_gap_fraction": self.small_gap_fraction,
      "itl_p50_s": self.itl_p50_s,
      "tpot_p50_s": self.tpot_p50_s,
      "peak_streams": self.peak_streams,
      "ttft_p50_s": self.ttft_p50_s,
      "send_lag_max_s": self.send_lag_max_s,
      "bottleneck": self.bottleneck,
      "paired": self.paired,
    }


class UsageMeter:
  """Measures the calling process from its creation to usage()."""

  def __init__(self):
    self._wall = time.monotonic()
    self._cpu = _cpu_seconds()
    self._busy = _busy_seconds_by_thread()

  def _busy_seconds(self) -> float | None:
    now = _busy_seconds_by_thread()
    if now is None or self._busy is None:
      return None
    return sum(seconds - self._busy.get(tid, 0.0) for tid, seconds in now.items())

  def usage(
    self,
    process: int,
    records: Sequence[RequestRecord],
    offsets: Sequence[float] | None = None,
  ) -> ClientUsage:
    """records: relative to the run's start; offsets: their scheduled send times, where known."""
    gaps = [gap for r in records if r.success for gap in r.itls]
    # no offsets (send times unknown): nothing is paired
    sent = [(r.start_time, o) for r, o in zip(records, offsets or (), strict=False) if r.success]
    tpots = [r.tpot for r in records if r.success and r.tpot is not None]
    ttfts = [r.ttft for r in records if r.success]
    return ClientUsage(
      process=process,
      requests=len(records),
      wall_s=time.monotonic() - self._wall,
      cpu_s=_cpu_seconds() - self._cpu,
      busy_s=self._busy_seconds(),
      gaps=len(gaps),
      small_gaps=sum(gap < SMALL_GAP_S for gap in gaps),
      itl_p50_s=statistics.median(gaps) if gaps else None,
      tpot_p50_s=statistics.median(tpots) if tpots else None,
      peak_streams=peak_streams(records),
      ttft_p50_s=statistics.median(ttfts) if ttfts else None,
      send_lag_max_s=max((start - offset for start, offset in sent), default=None),
    )


def peak_streams(records: Sequence[RequestRecord]) -> int:
  """The most streams streaming at once: each successful record from its first chunk to its
  last (a request waiting in the server's queue sends nothing to parse)."""
  events = sorted(
    edge
    for r in records
    if r.success
    for edge in ((r.start_time + r.ttft, 1), (r.start_time + r.e2e, -1))  # at one time, ends first
  )
  open_now = peak = 0
  for _, step in events:
    open_now += step
    peak = max(peak, open_now)
  return peak


def small_gap_fraction(usages: Sequence[ClientUsage]) -> float:
  gaps = sum(u.gaps for u in usages)
  return sum(u.small_gaps for u in usages) / gaps if gaps else 0.0


def client_report(usages: Sequence[ClientUsage], plan_reason: str) -> list[str]:
  """The report's client lines, in the result table's layout."""
  row = lambda name, value: f"{name:<40} {value:<10}"
  lines = [row("Client processes:", f"{len(usages)} ({plan_reason})")]
  lines.append(row("Client CPU time (s):", f"{sum(u.cpu_s for u in usages):.2f}"))
  lines.append(row("Client chunk gaps under 1 ms:", f"{small_gap_fraction(usages):.3f}"))
  for u in usages:
    busy = "unknown" if u.busy_share is None else f"{u.busy_share:.2f}"
    lines.append(
      f"  client {u.process}: {u.requests} requests, CPU {u.cpu_s:.2f} s "
      f"({u.cpu_share:.2f} of a core), busy {busy}, gaps under 1 ms {u.small_gap_fraction:.3f}, "
      f"ITL / TPOT p50 {_ms(u.itl_p50_s)} / {_ms(u.tpot_p50_s)} ms"
    )
  return lines


def bottleneck_warnings(usages: Sequence[ClientUsage], cores: int) -> list[str]:
  """One warning per client process that had no idle time."""
  warnings = []
  for u in usages:
    if u.bottleneck:
      busy = max(u.cpu_share, u.busy_share or 0.0)
      warnings.append(
        f"WARNING: client process {u.process} was busy {busy:.0%} of the run (CPU "
        f"{u.cpu_share:.0%} of a core): the benchmark client may have limited these numbers; "
        f"run more client processes (--client-processes; CPU cores available: {cores}) or give "
        "them more CPU"
      )
  return warnings


def paired_warnings(usages: Sequence[ClientUsage]) -> list[str]:
  """One warning per client process whose chunks came in pairs."""
  return [
    f"WARNING: client process {u.process} read {u.small_gap_fraction:.0%} of its chunks under "
    f"{SMALL_GAP_S * 1e3:.0f} ms after the one before (ITL / TPOT p50 {_ms(u.itl_p50_s)} / "
    f"{_ms(u.tpot_p50_s)} ms): the server sent several steps at once, or this process read "
    "late, in bursts, with more streams open than it parses between two steps; more client "
    "processes (--client-processes) tell the two apart"
    for u in usages
    if u.paired
  ]


def _ms(seconds: float | None) -> str:
  return "-" if seconds is None else f"{seconds * 1e3:.2f}"
