"""Prometheus metrics on a per-app CollectorRegistry (no global registry, so several apps and
tests can live in one process).

Engine gauges (running/waiting requests, KV pages used/total) and counters (preemptions, XLA
compilations) are read at scrape time from the engine core's stats snapshot (the CoreClient's last
one) by a custom collector. Request latencies and token counts are observed by the handlers as
outputs arrive: time to first token, inter-token latency and end-to-end latency come from
RequestOutput.metrics (engine clock), so they include time spent waiting in the queue. One more
is on the API server's clock: jaxserve_request_output_gap_seconds, the time between a request's
outputs as its handler takes them (what the engine's inter-token latency does not explain, e.g.
outputs of two steps taken back to back, is the API server's).

vLLM's names (server/vllm_metrics.py) are exported beside these: each observation is made once,
by an `Observation`, which records it in every family that reports it (`jaxserve_*` and
`vllm:*`), so the two never disagree and nothing is counted twice.

Several engine cores (data_parallel_size > 1): the `jaxserve_*` families are the sums over the
cores (the engine gauges and counters from DataParallelClient's summed stats, the request
families fed by every core's requests), with `jaxserve_engine_cores` and
`jaxserve_engine_cores_alive`; the `vllm:*` families hold one sample per core under its `engine`
label (a request's observations go to the child of the core that served it:
ServerMetrics.for_engine), as vLLM's data parallel deployment exports them.

Several API server processes (server.api_server_count > 1) share one port, so a scrape reaches
any one of them: their request families (latencies, token and request counters) are recorded in
prometheus_client's multi-process mode, in files of the supervisor's metrics_dir, and /metrics
sums every process's (those of a process that died included, so counters never go back); the
engine families come from the engine core's stats, the same in every process. The periodic stats
line (server/stats_logger.py) reads `registry`: this process's own values.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from jaxserve.api.outputs import RequestOutput
from jaxserve.core.dp_client import EngineClient
from jaxserve.server.vllm_metrics import (
  VllmEngineCollector,
  finished_reason,
  vllm_request_families,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (
  0.001,
  0.0025,
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1.0,
  2.5,
  5.0,
  10.0,
  30.0,
  60.0,
  120.0,
)


class EngineStatsCollector(Collector):
  def __init__(self, engine: EngineClient):
    self._engine = engine

  def collect(self) -> Iterator[Metric]:
    stats, states = self._engine.stats, self._engine.core_states()
    for name, doc, value in (
      ("jaxserve_num_requests_running", "Requests in the running batch.", stats.num_running),
      ("jaxserve_num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting),
      ("jaxserve_kv_pages_used", "KV cache pages held by requests.", stats.num_used_pages),
      ("jaxserve_kv_pages_total", "Usable KV cache pages.", stats.num_total_pages),
      (
        "jaxserve_num_http_requests_waiting",
        "HTTP requests admitted and not yet started "
        "(server.max_waiting_requests bounds it; each counted once whatever its n; the "
        "engine core's count, for every API server).",
        self._engine.num_http_waiting,
      ),
      (
        "jaxserve_api_servers",
        "API servers connected to the engine core "
        "(server.api_server_count once all have started, one fewer while a dead one "
        "restarts; 1 for the one-process server).",
        self._engine.num_api_servers,
      ),
      (
        "jaxserve_engine_cores",
        "Engine cores serving the model (data_parallel_size).",
        len(states),
      ),
      (
        "jaxserve_engine_cores_alive",
        "Engine cores still serving (fewer than jaxserve_engine_cores: one died, /health says "
        "degraded).",
        sum(state.alive for state in states),
      ),
      (
        "jaxserve_step_programs_compiled",
        "Step programs compiled so far (warmup and the "
        "background compile thread; config key warmup).",
        stats.num_programs_compiled,
      ),
      (
        "jaxserve_step_programs_total",
        "Step programs planned (0 when they compile on first use).",
        stats.num_programs_total,
      ),
      (
        "jaxserve_step_programs_compile_seconds",
        "Seconds from the warmup's start to the last step program compiled (0 until every "
        "program is; config keys warmup, compile_threads).",
        stats.programs_finished_after_s,
      ),
      (
        "jaxserve_device_memory_used_bytes",
        "Device memory the engine cores hold (JAX's bytes_in_use: weights, KV pool, live step "
        "buffers; 0 where the backend reports none, e.g. the CPU).",
        stats.device_bytes_in_use,
      ),
      (
        "jaxserve_engine_cores_sleeping",
        "Engine cores asleep (sleep mode: POST /sleep, config key enable_sleep_mode).",
        stats.num_sleeping,
      ),
    ):
      yield GaugeMetricFamily(name, doc, value=value)
    yield CounterMetricFamily(
      "jaxserve_preemptions", "Requests preempted to free KV pages.", value=stats.num_preemptions
    )
    yield CounterMetricFamily(
      "jaxserve_xla_compilations", "XLA compilations since start-up.", value=stats.num_compilations
    )


class Observation:
  """One kind of observation, recorded in every family that reports it (histograms observe it,
  counters add it)."""

  def __init__(self, *families: Histogram | Counter):
    self._families = families

  def observe(self, value: float) -> None:
    for family in self._families:
      family.observe(value)

  def inc(self, amount: float = 1) -> None:
    for family in self._families:
      family.inc(amount)


@dataclass(frozen=True)
class RequestObservations:
  """What the requests of one engine core feed: each Observation records in the jaxserve_*
  family (every core's together) and in vLLM's child of that core (its `engine` label)."""

  time_to_first_token: Observation
  inter_token_latency: Observation
  e2e_latency: Observation
  prompt_tokens: Observation
  generation_tokens: Observation
  requests_aborted: Observation
  requests_finished: Counter  # jaxserve's, by finish_reason
  request_success: dict[str, Counter]  # vLLM's, by finished_reason
  output_gap: Histogram  # jaxserve's: between a request's outputs as its handler takes them

  def request_finished(self, reason: str | None) -> None:
    """A request ended on its own (jaxserve's finish_reason; "unknown" if none)."""
    self.requests_finished.labels(reason or "unknown").inc()
    self.request_success[finished_reason(reason)].inc()


class ServerMetrics:
  """The app's collectors; each HTTP call feeds its outputs to an observer(engine index).
  model_name is the served model name (vLLM's `model_name` label); shared_dir the multi-process
  directory of the API servers of one supervisor (None: this process's metrics alone)."""

  def __init__(self, engine: EngineClient, model_name: str, shared_dir: str | None = None):
    self.registry = CollectorRegistry(auto_describe=True)
    engine_collectors = (EngineStatsCollector(engine), VllmEngineCollector(engine, model_name))
    for collector in engine_collectors:
      self.registry.register(collector)
    self._exposed = self.registry
    if shared_dir is not None:
      self._exposed = CollectorRegistry()
      MultiProcessCollector(self._exposed, path=shared_dir)
      for collector in engine_collectors:
        self._exposed.register(collector)
    num_engines = len(engine.core_states())
    vllm = vllm_request_families(self.registry, model_name, num_engines)
    kwargs = {"registry": self.registry}
    time_to_first_token = Histogram(
      "jaxserve_time_to_first_token_seconds",
      "From arrival to the first generated token.",
      buckets=_LATENCY_BUCKETS,
      **kwargs,
    )
    inter_token_latency = Histogram(
      "jaxserve_inter_token_latency_seconds",
      "Between consecutive generated tokens.",
      buckets=_LATENCY_BUCKETS,
      **kwargs,
    )
    e2e_latency = Histogram(
      "jaxserve_e2e_request_latency_seconds",
      "From arrival to the request's end.",
      buckets=_LATENCY_BUCKETS,
      **kwargs,
    )
    prompt_tokens = Counter(
      "jaxserve_prompt_tokens", "Prompt tokens of finished requests.", **kwargs
    )
    generation_tokens = Counter("jaxserve_generation_tokens", "Generated tokens.", **kwargs)
    requests_finished = Counter(
      "jaxserve_requests_finished", "Finished requests.", ["finish_reason"], **kwargs
    )
    requests_aborted = Counter(
      "jaxserve_requests_aborted", "Requests aborted because their client went away.", **kwargs
    )
    output_gap = Histogram(
      "jaxserve_request_output_gap_seconds",
      "Between consecutive outputs of one request as its HTTP handler takes them in the API "
      "server (the engine's inter-token latency plus the API server's delays: outputs taken "
      "back to back here reach the client as back-to-back chunks).",
      buckets=(0.0005, *_LATENCY_BUCKETS),
      **kwargs,
    )
    self.gc_pause = Histogram(
      "jaxserve_api_server_gc_pause_seconds",
      "How long each garbage collection held an API server process's event loop, by "
      "generation (every stream of the process waits meanwhile).",
      ["generation"],
      buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
      **kwargs,
    )
    self._engines = [
      RequestObservations(
        time_to_first_token=Observation(time_to_first_token, v.time_to_first_token),
        inter_token_latency=Observation(
          inter_token_latency, v.inter_token_latency, v.time_per_output_token
        ),
        e2e_latency=Observation(e2e_latency, v.e2e_request_latency),
        prompt_tokens=Observation(prompt_tokens, v.prompt_tokens),
        generation_tokens=Observation(generation_tokens, v.generation_tokens),
        requests_aborted=Observation(requests_aborted, v.request_success["abort"]),
        requests_finished=requests_finished,
        request_success=v.request_success,
        output_gap=output_gap,
      )
      for v in vllm
    ]

  def for_engine(self, index: int) -> RequestObservations:
    """The observations of requests engine core `index` serves."""
    return self._engines[index]

  def render(self) -> bytes:
    return generate_latest(self._exposed)

  def observer(self, engine_index: int = 0) -> OutputObserver:
    return OutputObserver(self.for_engine(engine_index))


class OutputObserver:
  """Observes the outputs of one HTTP call's requests (it remembers each one's last token time)."""

  def __init__(self, metrics: RequestObservations):
    self._metrics = metrics
    self._last_token_time: dict[str, float] = {}
    self._last_taken: dict[str, float] = {}

  def __call__(self, output: RequestOutput) -> None:
    last_token_time = self._last_token_time.get(output.request_id)
    timing, m = output.metrics, self._metrics
    if output.new_token_ids and timing is not None and timing.last_token_time is not None:
      if last_token_time is None and timing.first_token_time is not None:
        m.time_to_first_token.observe(timing.first_token_time - timing.arrival_time)
      elif last_token_time is not None:
        per_token = (timing.last_token_time - last_token_time) / len(output.new_token_ids)
        for _ in output.new_token_ids:
          m.inter_token_latency.observe(per_token)
      self._last_token_time[output.request_id] = timing.last_token_time
      m.generation_tokens.inc(len(output.new_token_ids))
    if output.new_token_ids:
      taken, previous = time.monotonic(), self._last_taken.get(output.request_id)
      if previous is not None:
        m.output_gap.observe(taken - previous)
      self._last_taken[output.request_id] = taken
    if output.finished:
      m.prompt_tokens.inc(len(output.prompt_token_ids))
      m.request_finished(output.finish_reason)
      if timing is not None and timing.finished_time is not None:
        m.e2e_latency.observe(timing.finished_time - timing.arrival_time)
