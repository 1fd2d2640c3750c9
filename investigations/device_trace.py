"""Where a jitted program's device time goes, kernel by kernel.

`capture_trace` runs a callable N times under `jax.profiler.trace(..., create_perfetto_trace=True)`;
`summarize_trace` reads the Chrome/Perfetto JSON that JAX writes under
`<logdir>/plugins/profile/<run>/` and aggregates the device-side events by name.

What counts as a device event depends on the backend, and the two are kept apart:
* accelerator (GPU/TPU): the trace has one process per device, named `/device:GPU:<n>`
  (`/device:TPU:<n>`), whose threads are the device's timelines. On GPU these are the CUPTI stream
  lines (`Stream #<id>(...)`), each event a CUDA kernel, memcpy or memset, named after the kernel
  (an XLA fusion name or a library kernel such as a cuBLAS gemm). Stream lines are used when
  present, otherwise an `XLA Ops` line (TPU), otherwise every line of the device process.
* CPU: there is no device process; the XLA CPU runtime records each executed thunk on the
  thread that ran it inside the `/host:CPU` process, tagged with `hlo_op` / `hlo_module` args.
  Thunks can nest (a while or conditional holds its body's thunks), so each event counts only its
  self time (minus the child op events on the same thread), and shares add up to one.

A trace with no device events raises `NoDeviceEventsError`, naming what the trace did hold.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import jax

DEVICE_PROCESS = re.compile(r"^/device:(GPU|TPU):\d+")
HOST_PROCESS = re.compile(r"^/host:CPU")
GPU_STREAM_THREAD = re.compile(r"^Stream #\d+")
TPU_OPS_THREAD = "XLA Ops"
NUMBERED_SUFFIX = re.compile(r"([._]\d+)+(\.clone)?$")


class NoDeviceEventsError(ValueError):
  """The trace holds no kernel / op events to attribute device time to."""


@dataclasses.dataclass(frozen=True)
class KernelTime:
  name: str
  count: int
  total_us: float
  mean_us: float
  share: float  # of all device time in the trace


@dataclasses.dataclass(frozen=True)
class TraceEvent:
  name: str
  pid: int
  tid: int
  start_us: float
  dur_us: float
  args: dict[str, object]


@dataclasses.dataclass(frozen=True)
class TraceLayout:
  """Process and thread names of a trace, by pid and (pid, tid)."""

  process_names: dict[int, str]
  thread_names: dict[tuple[int, int], str]


# --- capture ---------------------------------------------------------------------------------


@contextmanager
def device_trace(logdir: str | Path) -> Iterator[Path]:
  """Profiles the body into logdir (with a perfetto JSON trace); yields the logdir."""
  logdir = Path(logdir)
  logdir.mkdir(parents=True, exist_ok=True)
  with jax.profiler.trace(str(logdir), create_perfetto_trace=True):
    yield logdir


def capture_trace(
  fn: Callable[[], object], logdir: str | Path | None = None, reps: int = 10, warmup: int = 1
) -> Path:
  """Runs fn `warmup` times untraced, then `reps` times traced, blocking on each result.

  fn takes no arguments: close over the inputs (and rebind donated buffers inside it).
  Returns the logdir (a fresh temporary directory when none is given).
  """
  if reps < 1:
    raise ValueError(f"reps must be >= 1, got {reps}")
  for _ in range(warmup):
    jax.block_until_ready(fn())
  logdir = Path(logdir) if logdir is not None else Path(tempfile.mkdtemp(prefix="device_trace_"))
  with device_trace(logdir):
    for _ in range(reps):
      jax.block_until_ready(fn())
  return logdir


# --- reading ---------------------------------------------------------------------------------


def find_trace_file(logdir: str | Path) -> Path:
  """The newest run's trace JSON: perfetto_trace.json.gz, else <host>.trace.json.gz."""
  logdir = Path(logdir)
  runs = [p for p in (logdir / "plugins" / "profile").glob("*") if p.is_dir()]
  if not runs:
    raise ValueError(f"no profile under {logdir}/plugins/profile (was a trace captured there?)")
  latest = max(runs, key=lambda p: p.stat().st_mtime)
  candidates = sorted(latest.glob("perfetto_trace.json.gz")) or sorted(
    latest.glob("*.trace.json.gz")
  )
  if not candidates:
    raise ValueError(f"no *.trace.json.gz in {latest}")
  return candidates[0]


def load_trace(path: str | Path) -> tuple[TraceLayout, list[TraceEvent]]:
  with gzip.open(path, "rt") as f:
    raw = json.load(f)
  entries = raw["traceEvents"] if isinstance(raw, dict) else raw
  process_names: dict[int, str] = {}
  thread_names: dict[tuple[int, int], str] = {}
  events = []
  for e in entries:
    ph = e.get("ph")
    if ph == "M" and e.get("name") == "process_name":
      process_names[e["pid"]] = e.get("args", {}).get("name", "")
    elif ph == "M" and e.get("name") == "thread_name":
      thread_names[(e["pid"], e["tid"])] = e.get("args", {}).get("name", "")
    elif ph == "X" and "dur" in e:
      events.append(
        TraceEvent(
          e.get("name", ""),
          e.get("pid", 0),
          e.get("tid", 0),
          float(e.get("ts", 0.0)),
          float(e["dur"]),
          e.get("args", {}),
        )
      )
  return TraceLayout(process_names, thread_names), events


# --- accelerator (GPU / TPU) -----------------------------------------------------------------


def device_lines(layout: TraceLayout) -> set[tuple[int, int]]:
  """(pid, tid) of the device timelines: GPU streams, else TPU's XLA Ops, else all lines."""
  device_pids = {pid for pid, name in layout.process_names.items() if DEVICE_PROCESS.match(name)}
  lines: set[tuple[int, int]] = set()
  for pid in device_pids:
    threads = {key: name for key, name in layout.thread_names.items() if key[0] == pid}
    streams = {k for k, name in threads.items() if GPU_STREAM_THREAD.match(name)}
    ops = {k for k, name in threads.items() if name == TPU_OPS_THREAD}
    lines |= streams or ops or set(threads)
  return lines


def accelerator_kernel_events(
  layout: TraceLayout, events: Iterable[TraceEvent], by_op: bool = False
) -> list[tuple[str, float]]:
  """(name, duration) of the device lines' events; with by_op, named after the XLA instruction
  that launched them (the `hlo_op` arg, when the event has one) instead of the kernel."""
  lines = device_lines(layout)
  return [
    (str(e.args.get("hlo_op") or e.name) if by_op else e.name, e.dur_us)
    for e in events
    if (e.pid, e.tid) in lines and e.dur_us > 0
  ]


# --- CPU -------------------------------------------------------------------------------------


def cpu_op_events(layout: TraceLayout, events: Iterable[TraceEvent]) -> list[tuple[str, float]]:
  """Self time of each XLA op (thunk) event of the host process's executing threads."""
  host_pids = {pid for pid, name in layout.process_names.items() if HOST_PROCESS.match(name)}
  by_thread: dict[tuple[int, int], list[TraceEvent]] = defaultdict(list)
  for e in events:
    if e.pid in host_pids and "hlo_op" in e.args and e.dur_us > 0:
      by_thread[(e.pid, e.tid)].append(e)
  out = []
  for thread_events in by_thread.values():
    out += self_times(thread_events)
  return out


def self_times(events: list[TraceEvent]) -> list[tuple[str, float]]:
  """(name, duration minus direct children's durations) for properly nested events."""
  ordered = sorted(events, key=lambda e: (e.start_us, -e.dur_us))
  child_us = [0.0] * len(ordered)
  stack: list[int] = []
  for i, e in enumerate(ordered):
    while stack and ordered[stack[-1]].start_us + ordered[stack[-1]].dur_us <= e.start_us:
      stack.pop()
    if stack:
      child_us[stack[-1]] += e.dur_us
    stack.append(i)
  return [(e.name, max(e.dur_us - c, 0.0)) for e, c in zip(ordered, child_us, strict=True)]


# --- summary ---------------------------------------------------------------------------------


def has_accelerator(layout: TraceLayout) -> bool:
  return any(DEVICE_PROCESS.match(name) for name in layout.process_names.values())


def kernel_family(name: str) -> str:
  """The name without XLA's numbering: `loop_add_fusion.3` and `loop_add_fusion_12` are one
  family, so a fusion repeated once per layer adds up to one row."""
  return NUMBERED_SUFFIX.sub("", name) or name


def aggregate(samples: list[tuple[str, float]]) -> list[KernelTime]:
  totals: dict[str, float] = defaultdict(float)
  counts: dict[str, int] = defaultdict(int)
  for name, dur in samples:
    totals[name] += dur
    counts[name] += 1
  grand = sum(totals.values())
  rows = [
    KernelTime(name, counts[name], total, total / counts[name], total / grand)
    for name, total in totals.items()
  ]
  return sorted(rows, key=lambda r: r.total_us, reverse=True)


def summarize_trace(
  logdir: str | Path, by_family: bool = False, by_op: bool = False
) -> list[KernelTime]:
  """Device time per kernel (GPU/TPU) or XLA op (CPU) name, largest first; with by_family,
  per name without its numeric suffix (see kernel_family); with by_op, GPU kernels are named
  after the XLA instruction that launched them where the trace says (CPU events already are)."""
  path = find_trace_file(logdir)
  layout, events = load_trace(path)
  if has_accelerator(layout):
    samples = accelerator_kernel_events(layout, events, by_op)
    where = "device processes " + ", ".join(
      sorted(n for n in layout.process_names.values() if DEVICE_PROCESS.match(n))
    )
  else:
    samples = cpu_op_events(layout, events)
    where = "host XLA op events (args with hlo_op)"
  if not samples or sum(d for _, d in samples) <= 0:
    raise NoDeviceEventsError(
      f"no device events with positive duration in {path} ({where}); processes: "
      f"{sorted(set(layout.process_names.values()))}, {len(events)} complete events in all"
    )
  if by_family:
    samples = [(kernel_family(name), dur) for name, dur in samples]
  return aggregate(samples)


def total_device_us(rows: Iterable[KernelTime]) -> float:
  return sum(r.total_us for r in rows)


def print_kernel_table(rows: list[KernelTime], top: int = 25, reps: int | None = None) -> None:
  """Top kernels by total time; with reps, also the per-execution time of each."""
  total = total_device_us(rows)
  per = f" {'us/exec':>10s}" if reps else ""
  print(f"{'kernel':60s} {'count':>7s} {'total us':>11s} {'mean us':>9s}{per} {'share':>6s}")
  for r in rows[:top]:
    per = f" {r.total_us / reps:10.1f}" if reps else ""
    name = r.name if len(r.name) <= 60 else r.name[:57] + "..."
    print(f"{name:60s} {r.count:7d} {r.total_us:11.1f} {r.mean_us:9.2f}{per} {r.share:6.1%}")
  rest = rows[top:]
  if rest:
    print(
      f"{'(' + str(len(rest)) + ' more)':60s} {sum(r.count for r in rest):7d} "
      f"{total_device_us(rest):11.1f}"
    )
  per = f" per execution {total / reps:.1f} us" if reps else ""
  print(f"device time in trace {total:.1f} us over {len(rows)} kernels{per}")


def kernel_table_json(rows: list[KernelTime], top: int | None = None) -> list[dict]:
  return [dataclasses.asdict(r) for r in (rows if top is None else rows[:top])]
