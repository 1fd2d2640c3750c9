"""Data parallelism on one host, on real processes: `jaxserve serve --data-parallel-size 2` over
two forced CPU host devices (XLA_FLAGS=--xla_force_host_platform_device_count=2, so each engine
core process takes its own device of the two: core/device_groups.py), one API server process,
the official `openai` client and raw SSE streams.

One server serves the routing, metrics and fault tests (the fault test kills a core, so it runs
last of them); the drain test starts its own. Which core served a request is read from the
per-core counters of /metrics (vLLM's `engine` label)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import openai
import pytest

from tests.server.serve_process import ServeProcess
from tests.server.server_helpers import free_port, scrape_metrics, wait_for_idle
from tests.server.test_drain import _wait_until_draining, _write_config
from tests.server.test_process_faults import Stream

MODEL = "tiny-random"
SUCCESS = "vllm:request_success_total{{engine={},finished_reason=length,model_name=tiny-random}}"
RUNNING = "vllm:num_requests_running{{engine={},model_name=tiny-random}}"
PROMPT_TOKENS = "vllm:prompt_tokens_total{{engine={},model_name=tiny-random}}"


class DataParallelServer(ServeProcess):
  """`jaxserve serve --data-parallel-size 2 --api-server-count 1 --enable-sleep-mode` on two CPU
  host devices, with VLLM_SERVER_DEV_MODE=1 (the sleep routes)."""

  def __init__(self, tmp_path, warmup: str = "full"):
    config_path = str(tmp_path / "server.yaml")
    _write_config(config_path, drain_timeout_s=20, warmup=warmup)
    env = dict(os.environ, JAX_PLATFORMS="cpu", VLLM_SERVER_DEV_MODE="1")
    flag = "--xla_force_host_platform_device_count=2"
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
    flags = ["--data-parallel-size", "2", "--api-server-count", "1", "--enable-sleep-mode"]
    super().__init__(config_path, flags, api_servers=1, env=env)
    self.core_pids = self.logged_pids(r"engine core pids (\d+),(\d+), API server pids \d+")
    self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

  def served_counts(self) -> list[float]:
    values = scrape_metrics(self.url)
    return [values[SUCCESS.format(i)] for i in range(2)]

  def complete(self, prompt: str, max_tokens: int = 4) -> int:
    """One greedy completion; the engine core that served it."""
    before = self.served_counts()
    reply = self.client.completions.create(
      model=MODEL,
      prompt=prompt,
      max_tokens=max_tokens,
      temperature=0,
      extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length"
    after = self.served_counts()
    served = [i for i in range(2) if after[i] == before[i] + 1]
    assert len(served) == 1 and sum(after) == sum(before) + 1, (before, after)
    return served[0]

  def stop(self, timeout: float = 60) -> int:
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGTERM)
    try:
      return self.wait(timeout)
    finally:
      self.kill()

  def kill(self) -> None:
    self.kill_all(self.core_pids)


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory):
  server = DataParallelServer(tmp_path_factory.mktemp("dp"), warmup="lazy")
  yield server
  server.kill()


def _prompt(head: str, k: int) -> str:
  """A prompt of several KV pages (16 tokens each) starting with `head`, its tail `k`'s own."""
  return head * 4 + f" and then variant number {k}."


A = "The quick brown fox jumps over the lazy dog. "
B = "Lorem ipsum dolor sit amet, consectetur adipiscing. "


def test_the_engine_cores_own_one_device_each(dp_server):
  assert "engine core 0: device 0 (a slice of jax.devices()): cpu:0" in dp_server.output
  assert "engine core 1: device 1 (a slice of jax.devices()): cpu:1" in dp_server.output


def test_a_shared_prompt_prefix_goes_to_the_core_that_served_it(dp_server):
  """With both cores idle the least-loaded rule alternates between them (A1 -> one core, B1 ->
  the other); B2 would go back to A1's core on load alone, and goes to B1's for its prefix."""
  order = [(A, 1), (B, 1), (B, 2), (A, 2), (A, 3), (B, 3)]
  served = {(head, k): dp_server.complete(_prompt(head, k)) for head, k in order}
  cores_a = {core for (head, _), core in served.items() if head == A}
  cores_b = {core for (head, _), core in served.items() if head == B}
  assert len(cores_a) == 1 and len(cores_b) == 1 and cores_a != cores_b, served
  values = scrape_metrics(dp_server.url)
  hits = [values[f"vllm:prefix_cache_hits_total{{engine={i},model_name={MODEL}}}"] for i in (0, 1)]
  assert all(h > 0 for h in hits), hits  # each core's cache served its prefix's later calls


def test_metrics_per_core_and_summed(dp_server):
  compiled = scrape_metrics(dp_server.url)["jaxserve_xla_compilations_total"]
  streams = [Stream(dp_server.url, 100 + i) for i in range(4)]
  for stream in streams:
    stream.start()
  assert all(s.started.wait(30) for s in streams)
  values = scrape_metrics(dp_server.url)
  running = [values[RUNNING.format(i)] for i in (0, 1)]
  assert running[0] > 0 and running[1] > 0, running  # the load spread over both cores
  assert values["jaxserve_num_requests_running"] == sum(running)
  assert values["jaxserve_engine_cores"] == 2 and values["jaxserve_engine_cores_alive"] == 2
  for stream in streams:
    stream.join(60)
    assert stream.error is None and stream.lines[-1] == "data: [DONE]"
  values = wait_for_idle(dp_server.url)
  finished = [values[SUCCESS.format(i)] for i in (0, 1)]
  assert values["jaxserve_requests_finished_total{finish_reason=length}"] == sum(finished)
  prompt_tokens = [values[PROMPT_TOKENS.format(i)] for i in (0, 1)]
  assert values["jaxserve_prompt_tokens_total"] == sum(prompt_tokens)
  used = [values[f"vllm:kv_cache_usage_perc{{engine={i},model_name={MODEL}}}"] for i in (0, 1)]
  assert used == [0.0, 0.0]
  assert httpx.get(f"{dp_server.url}/health").json() == {"status": "ok"}
  # both cores warmed up fully: serving compiled nothing (no step of its own jit cache key)
  assert values["jaxserve_xla_compilations_total"] == compiled


def test_sleep_and_wake_reach_every_core(dp_server):
  """`jaxserve serve` end to end: the flag, the API server process's VLLM_SERVER_DEV_MODE, the
  calls crossing to both engine core processes."""
  url = dp_server.url
  assert httpx.post(f"{url}/sleep", params={"level": "1"}, timeout=60).status_code == 200
  assert httpx.get(f"{url}/is_sleeping", timeout=10).json() == {"is_sleeping": True}
  assert "engine asleep (level 1)" in dp_server.output
  assert httpx.post(f"{url}/wake_up", timeout=60).status_code == 200
  assert httpx.get(f"{url}/is_sleeping", timeout=10).json() == {"is_sleeping": False}
  assert {dp_server.complete(_prompt(head, 30)) for head in (A, B)} <= {0, 1}
  assert wait_for_idle(url)["jaxserve_kv_pages_used"] == 0


def test_a_killed_core_fails_its_requests_and_the_other_keeps_serving(dp_server):
  streams = [Stream(dp_server.url, 200 + i) for i in range(4)]
  for stream in streams:
    stream.start()
  assert all(s.started.wait(30) for s in streams)
  on_core_1 = scrape_metrics(dp_server.url)[RUNNING.format(1)]
  assert on_core_1 > 0
  os.kill(dp_server.core_pids[1], signal.SIGKILL)
  for stream in streams:
    stream.join(60)
  failed = [s for s in streams if '"error"' in s.lines[-2]]
  finished = [s for s in streams if s not in failed]
  assert len(failed) == on_core_1 and finished, [s.lines[-2:] for s in streams]
  for stream in streams:  # every stream ends cleanly with [DONE]
    assert stream.error is None and stream.lines[-1] == "data: [DONE]"
  for stream in failed:  # the error event of a dead engine core, as with one core
    error = json.loads(stream.lines[-2][6:])["error"]
    assert error["code"] == "internal_error" and "engine core" in error["message"]
  for stream in finished:
    assert json.loads(stream.lines[-2][6:])["choices"][0]["finish_reason"] == "length"
  health = httpx.get(f"{dp_server.url}/health")
  assert health.status_code == 200
  assert health.json() == {"status": "degraded", "engine_cores": 2, "engine_cores_alive": [0]}
  assert {dp_server.complete(_prompt(B, k)) for k in (7, 8, 9)} == {0}  # B's core was either
  values = scrape_metrics(dp_server.url)
  assert values["jaxserve_engine_cores_alive"] == 1 and values[RUNNING.format(1)] == 0
  assert "engine core 1 process died (killed by SIGKILL" in dp_server.output
  assert dp_server.stop() == 1  # it drains and stops; a core had failed


def test_sigterm_drains_every_core(tmp_path):
  server = DataParallelServer(tmp_path)
  try:
    streams = [Stream(server.url, 300 + i) for i in range(4)]
    for stream in streams:
      stream.start()
    assert all(s.started.wait(30) for s in streams)
    values = scrape_metrics(server.url)
    assert values[RUNNING.format(0)] > 0 and values[RUNNING.format(1)] > 0
    server.process.send_signal(signal.SIGTERM)
    _wait_until_draining(server.url)
    refused = httpx.post(f"{server.url}/v1/completions", json={"prompt": "late"}, timeout=10)
    assert refused.status_code == 503
    for stream in streams:
      stream.join(60)
    code = server.stop()
  finally:
    server.kill()
  assert code == 0, server.output
  for stream in streams:  # both cores' streams ran to their end
    assert stream.error is None and stream.lines[-1] == "data: [DONE]"
    assert json.loads(stream.lines[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_more_cores_than_devices_is_refused_naming_the_field(tmp_path):
  """One CPU device (no forced host devices) for two cores: `jaxserve serve` exits 2 with the
  error naming data_parallel_size, as any bad flag."""
  config_path = str(tmp_path / "server.yaml")
  _write_config(config_path, warmup="lazy")  # core 0 compiles nothing while core 1 fails
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = subprocess.run(
    [sys.executable, "-m", "jaxserve.cli", "serve", "--config", config_path]
    + ["--port", str(free_port()), "--data-parallel-size", "2", "--log-level", "WARNING"],
    capture_output=True,
    text=True,
    env=env,
    timeout=120,
  )
  assert run.returncode == 2, run.stdout + run.stderr
  assert "jaxserve serve: error: data_parallel_size: this engine core takes devices 1 to 1" in (
    run.stderr
  )
