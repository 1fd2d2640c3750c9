"""SIGTERM drains a real `jaxserve serve` process: the running stream finishes, new requests are
answered 503 with an OpenAI error body (the socket stays open while responses run), and the
process exits 0. Streams still running when
server.drain_timeout_s expires end with an error event and [DONE], with no traceback logged. A
terminal's Ctrl-C (SIGINT to the whole process group) drains the same way, and a second one ends
the running streams at once, each with an error event and [DONE]. A signal while the supervisor
is still spawning its API processes stops them all; the API processes start side by side, and a
SIGTERM to the whole group stops them idle with no ERROR logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import yaml

from jaxserve.bench.random_checkpoint import build_random_checkpoint
from jaxserve.models.model_config import ModelConfig
from tests.server.server_helpers import MAX_MODEL_LEN, free_port, scrape_metrics

MAX_TOKENS = 150


def _write_config(
  path: str, drain_timeout_s: float = 30, model: str = "tiny-random", warmup: str = "full"
) -> None:
  """server.yaml of a one-bucket tiny server on the run's XLA cache. warmup "full" (the drain
  tests) compiles every program before /health says ready; "lazy" each on first use, for tests
  whose requests need a few of them (or none) and that send no signal while a step could still
  compile."""
  cache_dir = os.environ["JAXSERVE_TEST_XLA_CACHE"]  # the run's cache (tests/conftest.py)
  config = {
    "model": model,
    "max_model_len": MAX_MODEL_LEN,
    "compilation_cache_dir": cache_dir,
    # full: every program compiled before /health says ready: a step that compiled (seconds on a
    # loaded CPU) when the signal came would hold the core past the supervisor's stop timeout
    "warmup": warmup,
    "cache": {"page_size": 16, "num_pages": 256},
    "scheduler": {
      "max_num_seqs": 16,
      "max_num_batched_tokens": 64,
      "seq_buckets": [16],
      "token_buckets": [64],
    },
    "server": {"drain_timeout_s": drain_timeout_s},
  }
  with open(path, "w") as f:
    yaml.safe_dump(config, f)


def _health_status(url: str) -> int | None:
  """/health's status code, None while nothing listens."""
  try:
    return httpx.get(f"{url}/health", timeout=5).status_code
  except httpx.TransportError:
    return None


def _wait_until_healthy(url: str, process: subprocess.Popen, timeout: float = 150) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert process.poll() is None, "the server exited during start-up"
    if _health_status(url) == 200:
      return
    time.sleep(0.2)
  raise AssertionError("the server did not become healthy")


def _wait_until_draining(url: str) -> None:
  """Until /health answers 503 (the signal was handled)."""
  deadline = time.monotonic() + 20
  while time.monotonic() < deadline:
    if _health_status(url) == 503:
      return
    time.sleep(0.01)
  raise AssertionError("the server did not start draining")


def _start_server(
  tmp_path,
  log_level: str,
  api_server_count: int | None = None,
  own_group: bool = False,
  **config,
) -> tuple[subprocess.Popen, str]:
  """A `jaxserve serve` process on a free port (the server.yaml of _write_config); its URL.
  own_group: in a process group of its own (a terminal's), which the test may signal whole."""
  config_path = str(tmp_path / "server.yaml")
  _write_config(config_path, **config)
  port = free_port()
  process = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "jaxserve.cli",
      "serve",
      "--config",
      config_path,
      "--port",
      str(port),
      "--log-level",
      log_level,
    ]
    + ([] if api_server_count is None else ["--api-server-count", str(api_server_count)]),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    start_new_session=own_group,
    # a terminal's job takes Ctrl-C; a test run started in the background (`cmd &`, nohup) would
    # hand the server an ignored SIGINT, which it keeps ignoring as any program does
    preexec_fn=_default_sigint if own_group else None,
  )
  return process, f"http://127.0.0.1:{port}"


def _default_sigint() -> None:
  signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("api_server_count", [2, 0])  # across processes; one process
def test_sigterm_drains_running_stream_and_exits_zero(tmp_path, api_server_count):
  process, url = _start_server(tmp_path, "WARNING", api_server_count)
  try:
    _wait_until_healthy(url, process)
    events: list[str] = []
    first = threading.Event()

    def stream() -> None:
      body = {
        "prompt": "drain me",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
      }
      with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
          if line:
            events.append(line)
            first.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert first.wait(30)
    process.send_signal(signal.SIGTERM)
    num_events_at_signal = len(events)
    _wait_until_draining(url)
    refused = httpx.post(
      f"{url}/v1/completions", json={"prompt": "late", "max_tokens": 2}, timeout=10
    )
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "service_unavailable"
    assert _health_status(url) == 503
    thread.join(60)
    output, _ = process.communicate(timeout=60)
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode == 0, output
  assert events[-1] == "data: [DONE]"
  assert len(events) > num_events_at_signal + 10  # the stream kept going after SIGTERM
  chunks = [json.loads(e[6:]) for e in events[:-1]]
  assert all("error" not in c for c in chunks)
  assert chunks[-2]["choices"][0]["finish_reason"] == "length"
  assert chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS


def test_streams_running_at_the_drain_timeout_end_with_an_error_event(tmp_path):
  process, url = _start_server(tmp_path, "INFO", drain_timeout_s=0.2)
  num_streams = 3
  try:
    _wait_until_healthy(url, process)
    events: list[list[str]] = [[] for _ in range(num_streams)]
    started = [threading.Event() for _ in range(num_streams)]

    def stream(i: int) -> None:
      body = {
        "prompt": f"drain {i}",
        "max_tokens": MAX_MODEL_LEN - 16,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
      }
      with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
          if line:
            events[i].append(line)
            started[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(num_streams)]
    for thread in threads:
      thread.start()
    assert all(event.wait(30) for event in started)
    process.send_signal(signal.SIGTERM)
    for thread in threads:
      thread.join(60)
    output, _ = process.communicate(timeout=60)
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode == 0, output
  assert "Traceback" not in output and "Exception in ASGI application" not in output, output
  assert "ended 3 running response(s)" in output
  for lines in events:
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][6:])["error"]
    assert error["code"] == "service_unavailable" and "drain_timeout_s" in error["message"]
    chunks = [json.loads(e[6:]) for e in lines[:-2]]
    assert chunks and all(c["choices"][0]["finish_reason"] is None for c in chunks)


class _Stream:
  """One streamed completion on a thread: its SSE lines, as they arrive."""

  def __init__(self, url: str, prompt: str, max_tokens: int):
    self.lines: list[str] = []
    self.started = threading.Event()
    body = {
      "prompt": prompt,
      "max_tokens": max_tokens,
      "temperature": 0,
      "ignore_eos": True,
      "stream": True,
    }
    self._thread = threading.Thread(target=self._read, args=(url, body))
    self._thread.start()

  def _read(self, url: str, body: dict) -> None:
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
      for line in response.iter_lines():
        if line:
          self.lines.append(line)
          self.started.set()

  def join(self, timeout: float = 60) -> None:
    self._thread.join(timeout)
    assert not self._thread.is_alive()

  @property
  def chunks(self) -> list[dict]:
    return [json.loads(line[6:]) for line in self.lines if line != "data: [DONE]"]


@pytest.mark.parametrize("api_server_count", [2, 0])  # supervisor and children; one process
def test_ctrl_c_in_a_terminal_drains_and_a_second_one_ends_the_streams(tmp_path, api_server_count):
  """A terminal's Ctrl-C sends SIGINT to the whole process group (supervisor, engine core and
  API server processes): the running streams go on and finish with [DONE], as with a SIGINT to
  the supervisor alone; a second Ctrl-C ends the ones still running at once with an error event
  and [DONE]; exit 0, no traceback, no ERROR. The API server used to take the terminal's SIGINT,
  after the supervisor's SIGTERM, for uvicorn's second Ctrl-C: streams cut without [DONE]
  (curl's exit 18) and CancelledError tracebacks."""
  process, url = _start_server(tmp_path, "INFO", api_server_count, own_group=True)
  try:
    _wait_until_healthy(url, process)
    short = _Stream(url, "ctrl-c, short", 40)
    long = _Stream(url, "ctrl-c, long", MAX_MODEL_LEN - 16)
    assert short.started.wait(30) and long.started.wait(30)
    os.killpg(process.pid, signal.SIGINT)
    at_signal = len(short.lines)
    short.join()
    try:
      _wait_until_draining(url)
    except AssertionError:  # the server's own account of the signal
      os.killpg(process.pid, signal.SIGKILL)
      raise AssertionError(process.communicate(timeout=30)[0][-4000:]) from None
    assert not long.lines or long.lines[-1] != "data: [DONE]", "the long stream ended already"
    os.killpg(process.pid, signal.SIGINT)
    sent = time.monotonic()
    long.join()
    ended_after_s = time.monotonic() - sent
    output, _ = process.communicate(timeout=60)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
  assert process.returncode == 0, output
  assert "Traceback" not in output and " ERROR " not in output, output
  assert short.lines[-1] == "data: [DONE]" and len(short.lines) > at_signal
  assert short.chunks[-1]["choices"][0]["finish_reason"] == "length"
  assert all("error" not in chunk for chunk in short.chunks)
  assert long.lines[-1] == "data: [DONE]", long.lines[-3:]
  error = long.chunks[-1]["error"]
  assert error["code"] == "service_unavailable" and "second stop signal" in error["message"]
  assert all(c["choices"][0]["finish_reason"] is None for c in long.chunks[:-1])
  assert ended_after_s < 5, f"the stream ended {ended_after_s:.1f} s after the second Ctrl-C"


# A tiny model with Llama 3's 128,256-id vocabulary: every API process loads its tokenizer
# (1.6 MB pickled, larger than a pipe's buffer) at start-up, as with a real checkpoint.
LARGE_VOCAB_SHAPE = ModelConfig(
  architecture="llama",
  vocab_size=128256,
  hidden_size=64,
  intermediate_size=128,
  num_layers=1,
  num_q_heads=4,
  num_kv_heads=2,
  head_dim=16,
  rms_norm_eps=1e-5,
  rope_theta=10000.0,
  max_position_embeddings=512,
  tie_word_embeddings=True,
  bos_token_id=128000,
  eos_token_ids=(128001,),
  dtype="bfloat16",
)


@pytest.fixture(scope="module")
def large_vocab_checkpoint(tmp_path_factory) -> str:
  """LARGE_VOCAB_SHAPE's random checkpoint, shared by the tests of this module."""
  directory = tmp_path_factory.mktemp("large-vocab") / "ckpt"
  return str(build_random_checkpoint(LARGE_VOCAB_SHAPE, directory, seed=0))


def test_sigterm_while_api_processes_start_stops_every_process(tmp_path, large_vocab_checkpoint):
  """The signal arrives right after the supervisor bound the port, while it spawns the API
  processes (no request runs: the core compiles nothing, warmup lazy): no further process
  starts, every started one drains (or dies of the signal while importing), and the supervisor
  exits 0. It used to wait forever for the API processes it
  spawned after the signal (seen on an H100 with an 8B checkpoint)."""
  process, _ = _start_server(
    tmp_path, "INFO", api_server_count=4, model=large_vocab_checkpoint, warmup="lazy"
  )
  try:
    for line in process.stdout:
      if "Uvicorn running on" in line:  # bind_socket's line: the spawning starts now
        process.send_signal(signal.SIGTERM)
        break
    output, _ = process.communicate(timeout=120)
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode == 0, output
  assert "draining the API server processes" in output
  assert "Traceback" not in output, output


def test_api_processes_start_side_by_side(tmp_path, large_vocab_checkpoint):
  """The supervisor has spawned all 4 API processes before the first one serves: none waits
  for another's imports (they did when the 1.6 MB tokenizer went through the spawn pipe: on an
  H100 host the 4th served 1.8-1.9 s after the 1st). /metrics counts them once all serve.
  Stopped idle by SIGTERM to its whole process group (as `timeout` sends it, and systemd to its
  cgroup), it logs no ERROR: the engine core, which gets the signal too, waits for the API
  servers to go (it used to stop first, and each logged that the core had stopped). No request
  runs, so the core compiles nothing (warmup lazy)."""
  process, url = _start_server(
    tmp_path,
    "INFO",
    api_server_count=4,
    own_group=True,
    model=large_vocab_checkpoint,
    warmup="lazy",
  )
  lines = []
  try:
    for line in process.stdout:
      lines.append(line)
      if sum("Application startup complete" in seen for seen in lines) == 4:
        break
    serving = next(i for i, line in enumerate(lines) if "jaxserve.core.supervisor: serving" in line)
    first_up = next(i for i, line in enumerate(lines) if "Application startup complete" in line)
    assert serving < first_up, "".join(lines)
    deadline = time.monotonic() + 30
    while scrape_metrics(url)["jaxserve_api_servers"] != 4:
      assert time.monotonic() < deadline, "the core did not count 4 API server processes"
      time.sleep(0.1)
    os.killpg(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
  assert process.returncode == 0, "".join(lines) + output
  assert " ERROR " not in output and "Traceback" not in output, output
