"""vLLM's metric names on /metrics (server/vllm_metrics.py), scraped over HTTP from the real
uvicorn server of tests/server (the engine core in its own process) after real requests: each
name with its labels and type, values that match what the client received, and every `vllm:*`
family equal to the `jaxserve_*` family its observation also feeds."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.server_helpers import wait_for_idle

MODEL = "tiny-random"  # the served model name: vLLM's model_name label
LABELS = {"model_name": MODEL, "engine": "0"}
PAGE_SIZE = 16  # tests/integration/engine_helpers.small_config's
FAMILIES = {
  "vllm:num_requests_running": "gauge",
  "vllm:num_requests_waiting": "gauge",
  "vllm:kv_cache_usage_perc": "gauge",
  "vllm:gpu_cache_usage_perc": "gauge",
  "vllm:prefix_cache_queries": "counter",
  "vllm:prefix_cache_hits": "counter",
  "vllm:gpu_prefix_cache_queries": "counter",
  "vllm:gpu_prefix_cache_hits": "counter",
  "vllm:num_preemptions": "counter",
  "vllm:prompt_tokens": "counter",
  "vllm:generation_tokens": "counter",
  "vllm:request_success": "counter",
  "vllm:time_to_first_token_seconds": "histogram",
  "vllm:time_per_output_token_seconds": "histogram",
  "vllm:inter_token_latency_seconds": "histogram",
  "vllm:e2e_request_latency_seconds": "histogram",
}
# (vllm sample, the jaxserve sample of the same observation)
TWINS = [
  ("vllm:prompt_tokens_total", "jaxserve_prompt_tokens_total"),
  ("vllm:generation_tokens_total", "jaxserve_generation_tokens_total"),
  ("vllm:num_preemptions_total", "jaxserve_preemptions_total"),
  ("vllm:num_requests_running", "jaxserve_num_requests_running"),
  ("vllm:num_requests_waiting", "jaxserve_num_requests_waiting"),
] + [
  (f"vllm:{v}_{part}", f"jaxserve_{j}_{part}")
  for v, j in (
    ("time_to_first_token_seconds", "time_to_first_token_seconds"),
    ("inter_token_latency_seconds", "inter_token_latency_seconds"),
    ("time_per_output_token_seconds", "inter_token_latency_seconds"),
    ("e2e_request_latency_seconds", "e2e_request_latency_seconds"),
  )
  for part in ("count", "sum")
]


def scrape(url: str) -> tuple[dict[str, str], dict[tuple[str, frozenset], float]]:
  """({family: type}, {(sample name, labels): value}) of one GET /metrics."""
  text = httpx.get(f"{url}/metrics", timeout=10).text
  types, samples = {}, {}
  for family in text_string_to_metric_families(text):
    types[family.name] = family.type
    for sample in family.samples:
      samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
  return types, samples


def value(samples: dict, name: str, **extra: str) -> float:
  labels = LABELS if name.startswith("vllm:") else {}
  return samples[(name, frozenset({**labels, **extra}.items()))]


def complete(url: str, prompt: list[int], max_tokens: int, stream: bool = False) -> dict:
  """The usage of a greedy completion (streamed: counted from the chunks)."""
  body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
  body |= {"ignore_eos": True, "stream": stream}
  if not stream:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["usage"]
  body["stream_options"] = {"include_usage": True}
  with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
    chunks = [json.loads(line[6:]) for line in response.iter_lines() if line[6:7] == "{"]
  return chunks[-1]["usage"]


@pytest.fixture(scope="module")
def traffic(served):
  """Three finished requests (the second repeats the first's 40-token prompt, the third is
  streamed) between two idle scrapes: (usages, scrape before, scrape after)."""
  vocab = served.backend.vocab_size
  prompt = random.Random(31).choices(range(3, vocab), k=40)
  wait_for_idle(served.url)
  before = scrape(served.url)[1]
  usages = [
    complete(served.url, prompt, 6),
    complete(served.url, prompt, 5),
    complete(served.url, prompt[:20], 4, stream=True),
  ]
  wait_for_idle(served.url)
  return usages, before, scrape(served.url)


def test_every_vllm_name_has_its_type_and_labels(served, traffic):
  types, samples = traffic[2]
  assert {name: types.get(name) for name in FAMILIES} == FAMILIES
  for (name, labels), _ in samples.items():
    if name.startswith("vllm:"):
      assert dict(labels).items() >= LABELS.items(), name
  reasons = {
    dict(labels)["finished_reason"]
    for name, labels in samples
    if name == "vllm:request_success_total"
  }
  assert reasons == {"stop", "length", "abort", "error"}
  buckets = [
    dict(labels)["le"]
    for name, labels in samples
    if name == "vllm:time_to_first_token_seconds_bucket"
  ]
  assert "0.04" in buckets and "2560.0" in buckets  # vLLM's buckets


def test_token_and_request_counters_equal_what_the_client_received(traffic):
  usages, before, (_, after) = traffic
  delta = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)
  assert delta("vllm:generation_tokens_total") == sum(u["completion_tokens"] for u in usages) == 15
  assert delta("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages) == 100
  assert delta("vllm:request_success_total", finished_reason="length") == 3
  for reason in ("stop", "abort", "error"):
    assert delta("vllm:request_success_total", finished_reason=reason) == 0
  assert delta("vllm:time_to_first_token_seconds_count") == 3
  assert delta("vllm:e2e_request_latency_seconds_count") == 3
  # one interval per token after each request's first
  assert delta("vllm:inter_token_latency_seconds_count") == 15 - 3
  assert delta("vllm:time_per_output_token_seconds_count") == 15 - 3
  ttft, e2e = (
    delta("vllm:time_to_first_token_seconds_sum"),
    delta("vllm:e2e_request_latency_seconds_sum"),
  )
  assert 0 < ttft < e2e < 60


def test_prefix_cache_counters_count_tokens(traffic):
  """The repeated 40-token prompt hits its 2 full pages (32 tokens; never the last token); the
  streamed one's first 20 tokens hit 1 page. Queries are every admitted prompt's tokens."""
  _, before, (_, after) = traffic
  delta = lambda name: value(after, name) - value(before, name)
  assert delta("vllm:prefix_cache_queries_total") == 40 + 40 + 20
  assert delta("vllm:prefix_cache_hits_total") == 2 * PAGE_SIZE + PAGE_SIZE
  assert delta("vllm:gpu_prefix_cache_queries_total") == 100
  assert delta("vllm:gpu_prefix_cache_hits_total") == 3 * PAGE_SIZE


def test_vllm_families_equal_their_jaxserve_twins(traffic):
  """Each observation is recorded once, in both families."""
  _, _, (_, samples) = traffic
  assert [value(samples, v) for v, _ in TWINS] == [value(samples, j) for _, j in TWINS]
  assert value(samples, "vllm:kv_cache_usage_perc") == 0.0  # idle: cached pages count as free


def test_running_request_kv_usage_and_an_abort(served):
  """While a long stream runs (the engine core process stopped right after its first chunk, so
  the request cannot finish under the scrape): one running request and the KV usage fraction of
  the jaxserve page gauges; the client leaving counts one vLLM "abort" with jaxserve's aborted
  counter."""
  body = {"model": MODEL, "prompt": "a long one", "max_tokens": 200, "temperature": 0}
  body |= {"ignore_eos": True, "stream": True}
  wait_for_idle(served.url)
  before = scrape(served.url)[1]
  core = served.core.process.pid
  try:
    with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=60) as response:
      next(line for line in response.iter_lines() if line.startswith("data: {"))
      os.kill(core, signal.SIGSTOP)
      samples = scrape(served.url)[1]
    deadline = time.monotonic() + 10  # the client left: the API server aborts its request
    while value(scrape(served.url)[1], "jaxserve_requests_aborted_total") == value(
      before, "jaxserve_requests_aborted_total"
    ):
      assert time.monotonic() < deadline, "the request was not aborted"
      time.sleep(0.02)
  finally:
    os.kill(core, signal.SIGCONT)
  assert value(samples, "vllm:num_requests_running") == 1
  used, total = value(samples, "jaxserve_kv_pages_used"), value(samples, "jaxserve_kv_pages_total")
  assert 0 < value(samples, "vllm:kv_cache_usage_perc") == used / total < 1
  assert value(samples, "vllm:gpu_cache_usage_perc") == used / total
  wait_for_idle(served.url)
  after = scrape(served.url)[1]
  delta = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)
  assert delta("vllm:request_success_total", finished_reason="abort") == 1
  assert delta("jaxserve_requests_aborted_total") == 1
  assert delta("vllm:request_success_total", finished_reason="length") == 0
