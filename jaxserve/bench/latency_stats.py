"""Serving metrics with vLLM's benchmark_serving definitions.

Per request: TTFT is the time from sending to the first streamed chunk that carries content; E2E is
the time to the last chunk; ITLs are the gaps between consecutive content chunks; TPOT is
(E2E - TTFT) / (output tokens - 1) (requests with one output token have none). ITLs are pooled
over all requests. Throughputs divide totals over successful requests by the benchmark duration.
Times are seconds inside and milliseconds in the summary. Which percentiles are computed, and
which metrics the table prints them for, are vLLM's --metric-percentiles / --percentile-metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class RequestRecord:
  """What one request saw. output_tokens comes from the server's usage when it reports one."""

  success: bool
  prompt_len: int
  expected_output_len: int
  output_tokens: int = 0
  ttft: float = 0.0
  e2e: float = 0.0
  itls: tuple[float, ...] = ()
  start_time: float = 0.0
  usage_reported: bool = False
  error: str = ""

  @property
  def tpot(self) -> float | None:
    if self.output_tokens <= 1:
      return None
    return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Distribution:
  """mean / median / std / percentiles of a latency, in milliseconds."""

  mean_ms: float
  median_ms: float
  std_ms: float
  percentiles_ms: dict[str, float] = field(default_factory=dict)

  @classmethod
  def of(cls, seconds: Sequence[float], percentiles: Sequence[float] = PERCENTILES) -> Distribution:
    values = np.asarray(seconds, dtype=np.float64) * 1e3
    if values.size == 0:
      return cls(0.0, 0.0, 0.0, {_pname(p): 0.0 for p in percentiles})
    return cls(
      float(values.mean()),
      float(np.median(values)),
      float(values.std()),
      {_pname(p): float(np.percentile(values, p)) for p in percentiles},
    )


def _pname(percentile: float) -> str:
  """50 -> "p50", 99.9 -> "p99.9"."""
  return f"p{percentile:g}"


def parse_percentiles(text: str) -> tuple[float, ...]:
  """--metric-percentiles: "50,90,99" -> (50.0, 90.0, 99.0); always includes 50 and 99."""
  try:
    values = [float(item) for item in text.split(",") if item.strip()]
  except ValueError as err:
    raise ValueError(
      f"metric_percentiles: {text!r} is not a comma-separated list of numbers"
    ) from err
  if not values or not all(0 < v < 100 for v in values):
    raise ValueError(f"metric_percentiles: each must be in (0, 100), got {text!r}")
  return tuple(sorted(set(values) | {50.0, 99.0}))


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
  """--percentile-metrics: "ttft,tpot" -> ("ttft", "tpot")."""
  names = tuple(item.strip() for item in text.split(",") if item.strip())
  unknown = [n for n in names if n not in PERCENTILE_METRICS]
  if not names or unknown:
    raise ValueError(
      f"percentile_metrics: {text!r}: each must be one of {', '.join(PERCENTILE_METRICS)}"
    )
  return names


@dataclass(frozen=True)
class BenchmarkMetrics:
  completed: int
  failed: int
  duration_s: float
  total_input_tokens: int
  total_output_tokens: int
  request_throughput: float
  output_throughput: float
  total_token_throughput: float
  ttft: Distribution
  tpot: Distribution
  itl: Distribution
  e2e: Distribution
  request_goodput: float | None = None  # requests meeting every --goodput SLO per second

  def to_dict(self) -> dict:
    return asdict(self)


def summarize(
  records: Sequence[RequestRecord],
  duration_s: float,
  percentiles: Sequence[float] = PERCENTILES,
  num_good: int | None = None,
) -> BenchmarkMetrics:
  """num_good: how many requests met the goodput SLOs (None: no SLOs given)."""
  done = [r for r in records if r.success]
  of = lambda values: Distribution.of(values, percentiles)
  input_tokens = sum(r.prompt_len for r in done)
  output_tokens = sum(r.output_tokens for r in done)
  duration = max(duration_s, 1e-9)
  return BenchmarkMetrics(
    completed=len(done),
    failed=len(records) - len(done),
    duration_s=duration_s,
    total_input_tokens=input_tokens,
    total_output_tokens=output_tokens,
    request_throughput=len(done) / duration,
    output_throughput=output_tokens / duration,
    total_token_throughput=(input_tokens + output_tokens) / duration,
    ttft=of([r.ttft for r in done]),
    tpot=of([r.tpot for r in done if r.tpot is not None]),
    itl=of([gap for r in done for gap in r.itls]),
    e2e=of([r.e2e for r in done]),
    request_goodput=None if num_good is None else num_good / duration,
  )


def format_table(
  metrics: BenchmarkMetrics,
  title: str = "Serving Benchmark Result",
  percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl"),
) -> str:
  """The result table in vLLM's layout: mean, median and each percentile of the chosen metrics."""
  lines = [f"{' ' + title + ' ':=^50}"]
  row = lambda name, value: lines.append(f"{name:<40} {value:<10}")
  row("Successful requests:", metrics.completed)
  row("Failed requests:", metrics.failed)
  row("Benchmark duration (s):", f"{metrics.duration_s:.2f}")
  row("Total input tokens:", metrics.total_input_tokens)
  row("Total generated tokens:", metrics.total_output_tokens)
  row("Request throughput (req/s):", f"{metrics.request_throughput:.2f}")
  if metrics.request_goodput is not None:
    row("Request goodput (req/s):", f"{metrics.request_goodput:.2f}")
  row("Output token throughput (tok/s):", f"{metrics.output_throughput:.2f}")
  row("Total token throughput (tok/s):", f"{metrics.total_token_throughput:.2f}")
  sections = {
    "ttft": ("ttft", "TTFT", "Time to First Token"),
    "tpot": ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("itl", "ITL", "Inter-token Latency"),
    "e2el": ("e2e", "E2EL", "End-to-end Latency"),
  }
  for name in percentile_metrics:
    attr, short, heading = sections[name]
    dist: Distribution = getattr(metrics, attr)
    lines.append(f"{heading:-^50}")
    row(f"Mean {short} (ms):", f"{dist.mean_ms:.2f}")
    row(f"Median {short} (ms):", f"{dist.median_ms:.2f}")
    for key, value in dist.percentiles_ms.items():
      row(f"P{key[1:]} {short} (ms):", f"{value:.2f}")
  lines.append("=" * 50)
  return "\n".join(lines)
