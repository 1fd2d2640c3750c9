"""Two `jaxserve serve` processes on 127.0.0.1 form one jax.distributed job (one CPU device each,
tensor_parallel_size 2, gloo collectives): process 0 serves HTTP and the worker follows its steps.
A request's tokens and logprobs equal a one-process engine's, and both exit 0 after SIGTERM.
A SIGTERM during warm-up stops both hosts (JAX's preemption notifier would swallow it). A host
whose peers never arrive exits non-zero with a clear error within its timeout."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.composition.assembly import build_engine
from jaxserve.config.loader import load_config
from jaxserve.parallel.multihost import JOIN_FAILED_EXIT_CODE
from tests.integration.engine_helpers import run_to_completion

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180
EXIT_TIMEOUT_S = 60
PROMPT = [72, 101, 108, 108, 111, 44, 32, 109, 121, 32, 110, 97, 109, 101]  # "Hello, my name"
MAX_TOKENS = 12
# Executables of a 2-process job are kept apart from the one-process tests' cache.
CACHE_DIR = os.path.join(os.environ["JAXSERVE_TEST_XLA_CACHE"], "multihost")
CONFIG = f"""\
model: tiny-random
max_model_len: 128
attention_backend: xla
compilation_cache_dir: {CACHE_DIR}
cache: {{page_size: 16, num_pages: 64}}
scheduler: {{max_num_seqs: 4, max_num_batched_tokens: 32, seq_buckets: [4],
            token_buckets: [16, 32]}}
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _serve(config: Path, *args: str) -> subprocess.Popen:
  env = dict(os.environ)  # one CPU device per process: no forced device count
  env["XLA_FLAGS"] = " ".join(
    f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f
  )
  env["JAX_PLATFORMS"] = "cpu"
  return subprocess.Popen(
    [sys.executable, "-m", "jaxserve.cli", "serve", "--config", str(config), *args],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _post(url: str, body: dict) -> dict:
  request = urllib.request.Request(
    url, json.dumps(body).encode(), {"Content-Type": "application/json"}
  )
  with urllib.request.urlopen(request, timeout=60) as response:
    return json.loads(response.read())


def _wait_healthy(url: str, processes: list[subprocess.Popen]) -> None:
  deadline = time.monotonic() + START_TIMEOUT_S
  while time.monotonic() < deadline:
    for p in processes:
      if p.poll() is not None:
        output = p.stdout.read()[-4000:]
        raise AssertionError(f"a serve process exited with {p.returncode}:\n{output}")
    try:
      with urllib.request.urlopen(url, timeout=2) as response:
        if response.status == 200:
          return
    except OSError:
      time.sleep(0.5)
  raise AssertionError(f"{url} not healthy within {START_TIMEOUT_S} s")


def _compilations(http_port: int) -> float:
  with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as response:
    lines = response.read().decode().splitlines()
  return float(
    next(line for line in lines if line.startswith("jaxserve_xla_compilations")).split()[-1]
  )


def _one_process_reference(config: Path):
  engine = build_engine(load_config(config), show_progress=False)
  engine.add_request(
    PROMPT,
    SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True),
    request_id="ref",
  )
  return run_to_completion(engine)["ref"]


def test_two_processes_serve_the_tokens_of_one(tmp_path):
  config = tmp_path / "two_hosts.yaml"
  config.write_text(CONFIG)
  coordinator, http_port = _free_port(), _free_port()
  common = (
    "--tensor-parallel-size",
    "2",
    "--coordinator-address",
    f"127.0.0.1:{coordinator}",
    "--num-processes",
    "2",
  )
  worker = _serve(config, *common, "--process-id", "1")
  leader = _serve(config, *common, "--process-id", "0", "--port", str(http_port))
  try:
    _wait_healthy(f"http://127.0.0.1:{http_port}/health", [leader, worker])
    compilations_after_warmup = _compilations(http_port)
    body = _post(
      f"http://127.0.0.1:{http_port}/v1/completions",
      {
        "model": "tiny-random",
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": 0,
        "ignore_eos": True,
      },
    )
    compilations_after_request = _compilations(http_port)
  finally:
    leader.send_signal(signal.SIGTERM)
    leader_out, _ = leader.communicate(timeout=EXIT_TIMEOUT_S)
    worker_out, _ = worker.communicate(timeout=EXIT_TIMEOUT_S)
  assert leader.returncode == 0, leader_out[-4000:]
  assert worker.returncode == 0, worker_out[-4000:]
  assert "worker: process 0 stopped after" in worker_out

  reference = _one_process_reference(config)
  choice = body["choices"][0]
  assert choice["text"] == reference.text
  assert body["usage"]["completion_tokens"] == MAX_TOKENS
  np.testing.assert_allclose(
    choice["logprobs"]["token_logprobs"],
    [lp.logprob for lp in reference.logprobs],
    atol=1e-4,
    rtol=0,
  )
  assert compilations_after_request == compilations_after_warmup


def test_sigterm_during_warmup_is_honoured(tmp_path):
  """Both hosts have joined the job and warm up when each gets SIGTERM: each exits within 2 s
  (it used to be logged by JAX's preemption notifier and ignored, and the job went on to serve)."""
  config = tmp_path / "two_hosts.yaml"
  config.write_text(CONFIG.replace(CACHE_DIR, str(tmp_path / "xla")))  # real compilations
  coordinator = _free_port()
  common = ("--tensor-parallel-size", "2", "--coordinator-address", f"127.0.0.1:{coordinator}")
  common += ("--num-processes", "2")
  worker = _serve(config, *common, "--process-id", "1")
  leader = _serve(config, *common, "--process-id", "0", "--port", str(_free_port()))
  try:
    for process in (leader, worker):
      for line in process.stdout:
        if " joined; " in line:  # past jax.distributed.initialize: warm-up follows
          break
    sent = time.monotonic()
    for process in (leader, worker):
      process.send_signal(signal.SIGTERM)
    for process in (leader, worker):
      process.wait(timeout=EXIT_TIMEOUT_S)
    seconds = time.monotonic() - sent
  finally:
    for process in (leader, worker):
      if process.poll() is None:
        process.kill()
      process.communicate()
  # 0 once the engine's build has begun (core/in_process.py), before that SIGTERM's default
  # action; either way the host stopped rather than going on to serve
  assert leader.returncode in (0, -signal.SIGTERM)
  assert worker.returncode == -signal.SIGTERM
  assert seconds < 2.0, f"exited {seconds:.2f} s after SIGTERM"


@pytest.mark.parametrize("process_id", [0, 1])
def test_a_host_whose_peer_never_joins_exits_with_a_clear_error(tmp_path, process_id):
  config = tmp_path / "alone.yaml"
  config.write_text(CONFIG)
  timeout_s = 3
  start = time.monotonic()
  alone = _serve(
    config,
    "--tensor-parallel-size",
    "2",
    "--coordinator-address",
    f"127.0.0.1:{_free_port()}",
    "--num-processes",
    "2",
    "--process-id",
    str(process_id),
    "--set",
    f"distributed.initialization_timeout_s={timeout_s}",
  )
  out, _ = alone.communicate(timeout=EXIT_TIMEOUT_S)
  assert alone.returncode == JOIN_FAILED_EXIT_CODE, out[-3000:]
  assert f"process {process_id} of 2 could not complete the job at 127.0.0.1:" in out
  assert "initialization_timeout_s" in out
  assert time.monotonic() - start < timeout_s + 30
