"""Slow and stuck clients on a real `jaxserve serve` (an engine core process and one API server
process; server/http_protocol.py): a client that stops reading its stream is disconnected after
server.stream_stall_timeout_s and its request aborted (its KV pages come back) while a concurrent
stream completes normally and its token gaps stay those of a stream alone; a request head that
never completes is closed after server.header_timeout_s; a head still incomplete past
server.h11_max_incomplete_event_size gets a 400 with OpenAI's error body."""

from __future__ import annotations

import itertools
import json
import os
import socket
import statistics
import threading
import time

import openai
import pytest
import yaml

from tests.server.server_helpers import free_port, scrape_metrics, serve_process, wait_for_idle

STALL_TIMEOUT_S = 2
HEADER_TIMEOUT_S = 2
MAX_MODEL_LEN = 2048
STALL_LOG_LINE = "took nothing of its /v1/completions response for 2 s"


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
  """A `jaxserve serve` with a 2 s stall timeout and a 2 s header timeout; (URL, log path)."""
  tmp = tmp_path_factory.mktemp("slow")
  config = {
    "model": "tiny-random",
    "max_model_len": MAX_MODEL_LEN,
    "compilation_cache_dir": os.environ["JAXSERVE_TEST_XLA_CACHE"],
    "warmup": "lazy",  # the programs the tests' requests use, each on its first step
    "cache": {"page_size": 16, "num_pages": 512},
    "scheduler": {
      "max_num_seqs": 16,
      "max_num_batched_tokens": 64,
      "seq_buckets": [16],
      "token_buckets": [64],
    },
  }
  (tmp / "server.yaml").write_text(yaml.safe_dump(config))
  port = free_port()
  argv = ["serve", "--config", str(tmp / "server.yaml"), "--port", str(port)]
  argv += ["--api-server-count", "1", "--stream-stall-timeout", str(STALL_TIMEOUT_S)]
  argv += ["--header-timeout", str(HEADER_TIMEOUT_S)]
  log = tmp / "server.log"
  with serve_process(argv, log) as url:
    yield url, log


def _connect(url: str, rcvbuf: int | None = None) -> socket.socket:
  sock = socket.socket()
  if rcvbuf is not None:  # before connect: the window the client advertises
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
  host, port = url.removeprefix("http://").split(":")
  sock.connect((host, int(port)))
  return sock


def _post(sock: socket.socket, path: str, body: dict) -> None:
  data = json.dumps(body).encode()
  head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
  sock.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)


def _stream_gaps(url: str, max_tokens: int, prompt: str) -> tuple[list[float], int, str]:
  """A streamed completion through the openai client: its chunk gaps, tokens, finish reason."""
  times, finish = [], None
  with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
    stream = client.completions.create(
      model="tiny-random",
      prompt=prompt,
      max_tokens=max_tokens,
      temperature=0,
      stream=True,
      stream_options={"include_usage": True},
      extra_body={"ignore_eos": True},
    )
    for chunk in stream:
      if chunk.choices:
        times.append(time.monotonic())
        finish = chunk.choices[0].finish_reason or finish
      if chunk.usage is not None:
        tokens = chunk.usage.completion_tokens
  return [b - a for a, b in itertools.pairwise(times)], tokens, finish


def _wait_for_abort(url: str, log, timeout: float) -> dict[str, float]:
  """/metrics once the stalled stream's request is aborted. The server's log says when it drops
  the client; until then the log is polled, not /metrics: a scrape every 0.1 s would keep the one
  API server process busy and slow both streams down (on 2 cores, 3x)."""
  deadline = time.monotonic() + timeout
  while STALL_LOG_LINE not in log.read_text() and time.monotonic() < deadline:
    time.sleep(0.1)
  while time.monotonic() < deadline:
    values = scrape_metrics(url)
    if values["jaxserve_requests_aborted_total"] >= 1:
      return values
    time.sleep(0.1)
  raise AssertionError("the stalled stream was not aborted")


def test_a_client_that_stops_reading_is_dropped_and_its_pages_return(slow_server):
  url, log = slow_server
  alone, _, _ = _stream_gaps(url, 100, "alone")
  # a stream with top-20 logprobs (about 700 bytes a token) whose client reads its response
  # head and then nothing, with a small receive window
  stalled = _connect(url, rcvbuf=4096)
  _post(
    stalled,
    "/v1/completions",
    {
      "prompt": "stalled",
      "max_tokens": MAX_MODEL_LEN - 100,
      "logprobs": 20,
      "ignore_eos": True,
      "temperature": 0,
      "stream": True,
    },
  )
  assert stalled.recv(12) == b"HTTP/1.1 200"
  started = time.monotonic()
  result: dict = {}
  healthy = threading.Thread(
    target=lambda: result.update(
      zip(("gaps", "tokens", "finish"), _stream_gaps(url, 200, "ok"), strict=True)
    )
  )
  healthy.start()
  try:
    aborted = _wait_for_abort(url, log, timeout=120)
    took = time.monotonic() - started
    healthy.join(120)
  finally:
    stalled.close()
  assert result["finish"] == "length" and result["tokens"] == 200  # completed normally
  idle = wait_for_idle(url)
  assert idle["jaxserve_kv_pages_used"] == 0 and idle["jaxserve_num_requests_running"] == 0
  # aborted, not finished: it would have taken far longer to write its 1948 tokens
  assert aborted["jaxserve_requests_finished_total{finish_reason=length}"] < 3
  assert took >= STALL_TIMEOUT_S
  text = log.read_text()
  assert STALL_LOG_LINE in text, text
  # the stalled stream's handler waits idle: the other stream's gaps are a lone stream's
  assert statistics.median(result["gaps"]) < 2 * statistics.median(alone) + 0.005, (alone, result)


def test_a_request_head_that_never_completes_is_closed(slow_server):
  url, log = slow_server
  sock = _connect(url)
  sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and nothing more
  sock.settimeout(HEADER_TIMEOUT_S + 10)
  started = time.monotonic()
  assert sock.recv(1024) == b""  # closed by the server
  assert HEADER_TIMEOUT_S - 0.5 <= time.monotonic() - started <= HEADER_TIMEOUT_S + 5
  sock.close()
  assert "sent no complete request head within 2 s (server.header_timeout_s)" in log.read_text()


def test_an_endless_request_head_gets_400_with_an_openai_error_body(slow_server):
  """Past server.h11_max_incomplete_event_size (16 KiB) of a head still incomplete."""
  url, _ = slow_server
  sock = _connect(url)
  sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000)
  sock.settimeout(10)
  data = b""
  while chunk := sock.recv(65536):
    data += chunk
  sock.close()
  head, _, body = data.partition(b"\r\n\r\n")
  assert head.startswith(b"HTTP/1.1 400")
  error = json.loads(body)["error"]
  assert error["code"] == "invalid_http_request" and error["type"] == "invalid_request_error"
