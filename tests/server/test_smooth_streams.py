"""Each engine step's tokens leave the API server when that step finishes: a stream gets one
chunk per step, and the chunk of one step is written before the next step's tokens are taken,
so a stream's chunks never arrive two or more at a time.

A real `jaxserve serve` (the engine core process and one API server process, tiny-random)
streams 31 chat completions whose every chunk carries top-20 logprobs (the API server's
heaviest per-token work). The API server process is then kept off the CPU for longer than a
step, again and again (SIGSTOP 40 ms, SIGCONT 10 ms: what an oversubscribed host, a long
request parse or a GC pause does to it), so that step messages from the engine core queue up
while it cannot run. A probe stream, read with the official openai client, records when each of
its chunks arrives. The load is read by one thread of raw sockets that wakes every 50 ms, so the
test process itself never holds the probe's chunks back.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import openai
import pytest

from jaxserve.bench.process_cpu import children, server_processes
from tests.server.server_helpers import free_port, serve_process

NUM_LOAD = 31  # with the probe: the engine's 32 sequences
PROBE_TOKENS = 30
STOPPED_S, RUNNING_S = 0.04, 0.01
SERVE_ARGS = [
  "--api-server-count",
  "1",
  "--max-model-len",
  "256",
  "--warmup",
  "full",
  "--set",
  "cache.num_pages=1100",
  "--set",
  "scheduler.max_num_seqs=32",
  "--set",
  "scheduler.max_num_batched_tokens=64",
  "--set",
  "scheduler.seq_buckets=[32]",
  "--set",
  "scheduler.token_buckets=[64]",
]


class LoadStreams:
  """Streaming chat completions over raw HTTP/1.1 sockets, drained by one thread every 50 ms."""

  def __init__(self, port: int, count: int, max_tokens: int):
    body = json.dumps(
      {
        "model": "tiny-random",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 20,
      }
    ).encode()
    head = (
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    self.received = [0] * count
    self._selector = selectors.DefaultSelector()
    for i in range(count):
      sock = socket.create_connection(("127.0.0.1", port))
      sock.sendall(head + body)
      sock.setblocking(False)
      self._selector.register(sock, selectors.EVENT_READ, i)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._drain, daemon=True)
    self._thread.start()

  def _drain(self) -> None:
    while not self._stop.wait(0.05):
      for key, _ in self._selector.select(0):
        data = key.fileobj.recv(1 << 20)
        self.received[key.data] += len(data)
        if not data:
          self._selector.unregister(key.fileobj)
          key.fileobj.close()

  def wait_streaming(self, timeout: float = 30.0) -> None:
    """Until every stream has sent its headers and a few chunks."""
    deadline = time.monotonic() + timeout
    while min(self.received) < 4096:
      assert time.monotonic() < deadline, "the load streams did not start"
      time.sleep(0.05)

  def close(self) -> None:
    self._stop.set()
    self._thread.join(5)
    for key in list(self._selector.get_map().values()):
      key.fileobj.close()
    self._selector.close()


class Stalls:
  """Keeps a process off the CPU: SIGSTOP for STOPPED_S, SIGCONT for RUNNING_S, until closed
  (which leaves it running)."""

  def __init__(self, pid: int):
    self._pid = pid
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self) -> None:
    try:
      while not self._stop.is_set():
        os.kill(self._pid, signal.SIGSTOP)
        time.sleep(STOPPED_S)
        os.kill(self._pid, signal.SIGCONT)
        self._stop.wait(RUNNING_S)
    finally:
      os.kill(self._pid, signal.SIGCONT)

  def close(self) -> None:
    self._stop.set()
    self._thread.join(5)


def _api_server_pid(port: int) -> int:
  """The API server process of the `jaxserve serve --port PORT` this process started."""
  for pid in children(os.getpid()):
    if f"--port\0{port}\0".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
      return server_processes(pid, api_servers=1)["api-0"]
  raise AssertionError(f"no `jaxserve serve --port {port}` among this process's children")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  port = free_port()
  argv = ["serve", "tiny-random", "--port", str(port), *SERVE_ARGS]
  log_path = tmp_path_factory.mktemp("smooth_streams") / "serve.log"
  with serve_process(argv, log_path) as url:
    yield url, port


def probe_arrivals(url: str) -> tuple[list[float], list[int]]:
  """When each chunk of one streamed completion arrived, and how many tokens each carried."""
  times, tokens = [], []
  with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
    stream = client.completions.create(
      model="tiny-random",
      prompt=[5, 6, 7],
      max_tokens=PROBE_TOKENS,
      logprobs=0,
      stream=True,
      extra_body={"ignore_eos": True},
    )
    for chunk in stream:
      times.append(time.perf_counter())
      tokens.append(len(chunk.choices[0].logprobs.tokens))
  return times, tokens


def test_a_stalled_servers_chunks_still_leave_one_step_at_a_time(served):
  url, port = served
  load = LoadStreams(port, NUM_LOAD, max_tokens=200)
  try:
    load.wait_streaming()
    stalls = Stalls(_api_server_pid(port))
    try:
      times, tokens = probe_arrivals(url)
    finally:
      stalls.close()
  finally:
    load.close()
  assert tokens == [1] * PROBE_TOKENS  # stream interval 1: a chunk per step, a token each
  gaps = np.diff(times)
  small = float((gaps < 1e-3).mean())
  median_ms, mean_ms = float(np.median(gaps)) * 1e3, float(gaps.mean()) * 1e3
  print(
    f"chunk gaps: {small:.2f} under 1 ms, median {median_ms:.2f} ms, mean {mean_ms:.2f} ms",
    file=sys.stderr,
  )
  assert small <= 0.15, (small, median_ms, mean_ms)
