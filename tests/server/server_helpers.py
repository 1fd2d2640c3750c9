"""Real uvicorn servers on 127.0.0.1 in background threads of the test process, over a small
tiny-random engine: the engine core in its own process (as `jaxserve serve` runs it) or on a
thread of the test process (CoreThread, as the one-process server, server.api_server_count 0,
runs it); either way each server is an API server with its own CoreClient."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import uvicorn

from jaxserve.composition.assembly import build_engine
from jaxserve.config import EngineConfig, ServerConfig
from jaxserve.config.generation_config import GenerationDefaults
from jaxserve.core.client import CoreClient
from jaxserve.core.in_process import CoreThread
from jaxserve.core.process import CoreHandle, start_core_process
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.server.app import build_app, serving_state
from jaxserve.server.state import ServingState
from jaxserve.tokenizer.tokenizer import Tokenizer
from tests.integration.engine_helpers import small_config

MAX_MODEL_LEN = 256


def server_engine_config(warmup: str = "auto", **server_fields):
  """One bucket pair, 16 sequences at once. warmup "auto": the engine core's background warmup
  compiles every program (a core shared by many tests); "lazy": each on the first step that
  needs it (a core for a few requests)."""
  return small_config(
    max_model_len=MAX_MODEL_LEN,
    max_num_seqs=16,
    max_tokens_per_step=64,
    seq_buckets=(16,),
    token_buckets=(64,),
    server=ServerConfig(**server_fields),
    warmup=warmup,
  )


def build_server_engine() -> LLMEngine:
  return build_engine(server_engine_config(), show_progress=False)


@dataclass(frozen=True)
class Backend:
  """What test servers are built over: make_client() gives each server its CoreClient."""

  tokenizer: Tokenizer
  model_name: str
  max_model_len: int
  vocab_size: int
  make_client: Callable[[], CoreClient]
  generation_defaults: GenerationDefaults = GenerationDefaults()


def start_core(config: EngineConfig | None = None) -> CoreHandle:
  """The engine core process (as `jaxserve serve` starts it)."""
  return start_core_process(config or server_engine_config(), "WARNING")


def core_backend(core: CoreHandle | CoreThread) -> Backend:
  """Servers over a running engine core, in its own process or on a thread."""
  info = core.info
  return Backend(
    info.tokenizer,
    info.model_name,
    info.max_model_len,
    info.vocab_size,
    lambda: CoreClient(core.address, info.tokenizer),
    info.generation_defaults,
  )


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


class RunningServer:
  """uvicorn.Server(config).run() in a thread (lifespan on: a CoreClient attaches); stop()
  shuts it down."""

  def __init__(self, app):
    self.app = app
    self.port = free_port()
    config = uvicorn.Config(
      app, host="127.0.0.1", port=self.port, lifespan="on", log_level="warning"
    )
    self.server = uvicorn.Server(config)
    self.thread = threading.Thread(target=self.server.run, daemon=True)
    self.thread.start()
    deadline = time.monotonic() + 30
    while not self.server.started:
      if time.monotonic() > deadline or not self.thread.is_alive():
        raise RuntimeError("uvicorn did not start")
      time.sleep(0.02)

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"

  @property
  def state(self) -> ServingState:
    return serving_state(self.app)

  def stop(self) -> None:
    self.server.should_exit = True
    self.thread.join(10)


def start_server(
  backend: Backend, client: CoreClient | None = None, dev_mode: bool = False, **server_fields
) -> RunningServer:
  app = build_app(
    client or backend.make_client(),
    backend.tokenizer,
    ServerConfig(**server_fields),
    model_name=backend.model_name,
    max_model_len=backend.max_model_len,
    vocab_size=backend.vocab_size,
    generation_defaults=backend.generation_defaults,
    dev_mode=dev_mode,
  )
  return RunningServer(app)


def scrape_metrics(base_url: str) -> dict[str, float]:
  """/metrics as {sample name: value} (unlabelled samples; labelled ones keyed name{k=v})."""
  import httpx
  from prometheus_client.parser import text_string_to_metric_families

  response = httpx.get(f"{base_url}/metrics", timeout=10)
  response.raise_for_status()
  values = {}
  for family in text_string_to_metric_families(response.text):
    for sample in family.samples:
      labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
      values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
  return values


def wait_for_idle(base_url: str, timeout: float = 10.0) -> dict[str, float]:
  """Polls /metrics until nothing runs, waits (HTTP requests included) or holds KV pages;
  returns the last scrape."""
  deadline = time.monotonic() + timeout
  while True:
    values = scrape_metrics(base_url)
    idle = (
      values["jaxserve_num_requests_running"] == 0
      and values["jaxserve_num_requests_waiting"] == 0
      and values["jaxserve_kv_pages_used"] == 0
      and values["jaxserve_num_http_requests_waiting"] == 0
    )
    if idle or time.monotonic() > deadline:
      return values
    time.sleep(0.05)


@contextlib.contextmanager
def serve_process(argv: list[str], log_path, env: dict | None = None) -> Iterator[str]:
  """`python -m jaxserve.cli serve ...` (`argv` after `jaxserve`, with --port) logging at INFO to
  log_path; yields its base URL once /health answers, and terminates it on exit."""
  from tests.server.test_drain import _wait_until_healthy  # test_drain imports this module

  port = argv[argv.index("--port") + 1]
  with open(log_path, "w") as log:
    process = subprocess.Popen(
      [sys.executable, "-m", "jaxserve.cli", *argv, "--log-level", "INFO"],
      stdout=log,
      stderr=subprocess.STDOUT,
      env=env,
    )
  url = f"http://127.0.0.1:{port}"
  try:
    _wait_until_healthy(url, process)
    yield url
  finally:
    process.terminate()
    process.wait(60)
