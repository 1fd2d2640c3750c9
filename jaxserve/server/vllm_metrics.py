"""vLLM's metric names, beside jaxserve's own, for the tools that read them: llm-d's inference
scheduler and the Gateway API inference extension (waiting requests, KV cache usage), vLLM
production-stack's router (running and waiting requests, KV usage, prefix cache hits and
queries), KEDA / HPA examples (waiting requests, KV usage) and vLLM's Grafana dashboards (TTFT,
TPOT, end-to-end latency, token and request counters).

Names, types and labels are vLLM V1's (vllm/v1/metrics/loggers.py, `PrometheusStatLogger`):
every family carries `model_name` (the served model name) and `engine` (the engine core's index:
"0" with one core; with data_parallel_size N, one sample per core, "0" to "N-1", as vLLM's data
parallel engines: an engine family's value is that core's own stats, a request family's child
is the core that served the request; their sum is what a one-core server reports), and
`vllm:request_success_total` adds `finished_reason` (stop, length, abort, error; created at 0 as
vLLM does). prometheus_client takes the colon in these names (it
is legal in the exposition format); a Counter named `vllm:prompt_tokens` is exposed as
`vllm:prompt_tokens_total`, as vLLM's is.

Contract: no value here is measured twice. The engine families are read at scrape time from the
same `EngineStats` snapshot as the `jaxserve_*` gauges (`VllmEngineCollector`); the request
families are children that server/metrics.py's `Observation`s feed with the very observation
that feeds the `jaxserve_*` family (so both always agree). Buckets are vLLM's, so its dashboards'
`le` values exist. docs/SCALE_OUT.md has the mapping table.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jaxserve.api.outputs import FinishReason
from jaxserve.core.dp_client import EngineClient
from jaxserve.engine.engine_stats import EngineStats

LABELS = ("model_name", "engine")
# vLLM's histogram buckets, in seconds
# fmt: off
TTFT_BUCKETS = (
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
TOKEN_INTERVAL_BUCKETS = (
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
  40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS = (
  0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
  480.0, 960.0, 1920.0, 7680.0,
)
# fmt: on
FINISHED_REASONS = ("stop", "length", "abort", "error")


def finished_reason(reason: str | None) -> str:
  """vLLM's `finished_reason` for jaxserve's finish_reason: its engine reasons are vLLM's; a
  chat choice that called tools stopped; a grammar's dead end is an error."""
  if reason == FinishReason.TOOL_CALLS:
    return "stop"
  return reason if reason in FINISHED_REASONS else "error"


class VllmEngineCollector(Collector):
  """The engine families, one sample per engine core, from each core's last EngineStats at each
  scrape (core_states(): a dead core's gauges are 0, its counters as last reported)."""

  def __init__(self, engine: EngineClient, model_name: str):
    self._engine = engine
    self._model_name = model_name

  def collect(self) -> Iterator[Metric]:
    states = self._engine.core_states()
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    for state in states:
      labels = [self._model_name, str(state.index)]
      for kind, name, doc, value in _engine_values(state.stats):
        if name not in families:
          families[name] = kind(name, doc, labels=LABELS)
        families[name].add_metric(labels, value)
    yield from families.values()


def _engine_values(stats: EngineStats) -> Iterator[tuple[type, str, str, float]]:
  """(family type, name, help, value) of each engine family for one core's stats."""
  usage = stats.num_used_pages / stats.num_total_pages if stats.num_total_pages else 0.0
  for name, doc, value in (
    ("vllm:num_requests_running", "Requests in the running batch.", stats.num_running),
    ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting),
    ("vllm:kv_cache_usage_perc", "KV cache usage; 1 means 100 percent.", usage),
    ("vllm:gpu_cache_usage_perc", "KV cache usage (vLLM's older name).", usage),
  ):
    yield GaugeMetricFamily, name, doc, value
  for name, doc, value in (
    (
      "vllm:prefix_cache_queries",
      "Prefix cache queries, in tokens.",
      stats.num_prefix_cache_queries,
    ),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", stats.num_prefix_cache_hits),
    (
      "vllm:gpu_prefix_cache_queries",
      "Prefix cache queries, in tokens (vLLM's older name).",
      stats.num_prefix_cache_queries,
    ),
    (
      "vllm:gpu_prefix_cache_hits",
      "Prefix cache hits, in tokens (vLLM's older name).",
      stats.num_prefix_cache_hits,
    ),
    ("vllm:num_preemptions", "Requests preempted to free KV pages.", stats.num_preemptions),
  ):
    yield CounterMetricFamily, name, doc, value


@dataclass(frozen=True)
class VllmRequestFamilies:
  """The request families' children for this server's labels."""

  time_to_first_token: Histogram
  time_per_output_token: Histogram
  inter_token_latency: Histogram
  e2e_request_latency: Histogram
  prompt_tokens: Counter
  generation_tokens: Counter
  request_success: dict[str, Counter]  # by vLLM's finished_reason


def vllm_request_families(
  registry: CollectorRegistry, model_name: str, num_engines: int = 1
) -> list[VllmRequestFamilies]:
  """The request families' children of each engine core (index i: core i's)."""
  histograms = {
    name: Histogram(name, doc, LABELS, buckets=buckets, registry=registry)
    for name, doc, buckets in _HISTOGRAMS
  }
  counters = {name: Counter(name, doc, LABELS, registry=registry) for name, doc in _COUNTERS}
  success = Counter(
    "vllm:request_success",
    "Finished requests, by finished_reason.",
    LABELS + ("finished_reason",),
    registry=registry,
  )
  engines = []
  for engine in range(num_engines):
    labels = (model_name, str(engine))
    engines.append(
      VllmRequestFamilies(
        time_to_first_token=histograms["vllm:time_to_first_token_seconds"].labels(*labels),
        time_per_output_token=histograms["vllm:time_per_output_token_seconds"].labels(*labels),
        inter_token_latency=histograms["vllm:inter_token_latency_seconds"].labels(*labels),
        e2e_request_latency=histograms["vllm:e2e_request_latency_seconds"].labels(*labels),
        prompt_tokens=counters["vllm:prompt_tokens"].labels(*labels),
        generation_tokens=counters["vllm:generation_tokens"].labels(*labels),
        request_success={r: success.labels(*labels, r) for r in FINISHED_REASONS},
      )
    )
  return engines


_HISTOGRAMS = (
  ("vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS),
  (
    "vllm:time_per_output_token_seconds",
    "Time per output token in seconds (each inter-token interval, as vLLM up to 0.10).",
    TOKEN_INTERVAL_BUCKETS,
  ),
  ("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", TOKEN_INTERVAL_BUCKETS),
  (
    "vllm:e2e_request_latency_seconds",
    "End-to-end request latency in seconds.",
    REQUEST_LATENCY_BUCKETS,
  ),
)
_COUNTERS = (
  ("vllm:prompt_tokens", "Prompt tokens of finished requests."),
  ("vllm:generation_tokens", "Generated tokens."),
)
