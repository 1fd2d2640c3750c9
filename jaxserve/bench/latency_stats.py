"""Serving metrics with vLLM's benchmark_serving definitions.

Per request: TTFT is the time from sending to the first streamed chunk that carries content; E2E is
the time to the last chunk; ITLs are the gaps between consecutive content chunks; TPOT is
(E2E - TTFT) / (output tokens - 1) (requests with one output token have none). ITLs are pooled
over all requests. Throughputs divide totals over successful requests by the benchmark duration.
Times are seconds inside and milliseconds in the summary.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

PERCENTILES = (50, 90, 99)


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
  def of(cls, seconds: Sequence[float]) -> Distribution:
    values = np.asarray(seconds, dtype=np.float64) * 1e3
    if values.size == 0:
      return cls(0.0, 0.0, 0.0, {f"p{p}": 0.0 for p in PERCENTILES})
    return cls(float(values.mean()), float(np.median(values)), float(values.std()),
               {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES})


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

  def to_dict(self) -> dict:
    return asdict(self)


def summarize(records: Sequence[RequestRecord], duration_s: float) -> BenchmarkMetrics:
  done = [r for r in records if r.success]
  input_tokens = sum(r.prompt_len for r in done)
  output_tokens = sum(r.output_tokens for r in done)
  duration = max(duration_s, 1e-9)
  return BenchmarkMetrics(
      completed=len(done), failed=len(records) - len(done), duration_s=duration_s,
      total_input_tokens=input_tokens, total_output_tokens=output_tokens,
      request_throughput=len(done) / duration, output_throughput=output_tokens / duration,
      total_token_throughput=(input_tokens + output_tokens) / duration,
      ttft=Distribution.of([r.ttft for r in done]),
      tpot=Distribution.of([r.tpot for r in done if r.tpot is not None]),
      itl=Distribution.of([gap for r in done for gap in r.itls]),
      e2e=Distribution.of([r.e2e for r in done]))


def format_table(metrics: BenchmarkMetrics, title: str = "Serving Benchmark Result") -> str:
  """The result table in vLLM's layout."""
  lines = [f"{' ' + title + ' ':=^50}"]
  row = lambda name, value: lines.append(f"{name:<40} {value:<10}")
  row("Successful requests:", metrics.completed)
  row("Failed requests:", metrics.failed)
  row("Benchmark duration (s):", f"{metrics.duration_s:.2f}")
  row("Total input tokens:", metrics.total_input_tokens)
  row("Total generated tokens:", metrics.total_output_tokens)
  row("Request throughput (req/s):", f"{metrics.request_throughput:.2f}")
  row("Output token throughput (tok/s):", f"{metrics.output_throughput:.2f}")
  row("Total token throughput (tok/s):", f"{metrics.total_token_throughput:.2f}")
  sections = (("ttft", "TTFT", "Time to First Token"),
              ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
              ("itl", "ITL", "Inter-token Latency"), ("e2e", "E2EL", "End-to-end Latency"))
  for attr, short, heading in sections:
    dist: Distribution = getattr(metrics, attr)
    lines.append(f"{heading:-^50}")
    row(f"Mean {short} (ms):", f"{dist.mean_ms:.2f}")
    row(f"Median {short} (ms):", f"{dist.median_ms:.2f}")
    row(f"P99 {short} (ms):", f"{dist.percentiles_ms['p99']:.2f}")
  lines.append("=" * 50)
  return "\n".join(lines)
