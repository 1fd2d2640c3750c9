"""A real uvicorn server on 127.0.0.1 in a background thread, over a small tiny-random engine."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from jaxserve.config import ServerConfig
from jaxserve.assembly import build_engine
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.server.app import build_app, serving_state
from jaxserve.server.async_engine import AsyncEngine
from jaxserve.server.state import ServingState
from tests.integration.engine_helpers import small_config

MAX_MODEL_LEN = 256


def server_engine_config(**server_fields):
  """One bucket pair keeps warmup to a few seconds; 16 sequences run at once."""
  return small_config(max_model_len=MAX_MODEL_LEN, max_num_seqs=16, max_tokens_per_step=64,
                      seq_buckets=(16,), token_buckets=(64,),
                      server=ServerConfig(**server_fields))


def build_server_engine() -> LLMEngine:
  return build_engine(server_engine_config(), show_progress=False)


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


class RunningServer:
  """uvicorn.Server(config).run() in a thread; stop() shuts it down."""

  def __init__(self, app):
    self.app = app
    self.port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=self.port, lifespan="off",
                            log_level="warning")
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


def start_server(async_engine: AsyncEngine, engine: LLMEngine, **server_fields) -> RunningServer:
  app = build_app(async_engine, engine.tokenizer, ServerConfig(**server_fields),
                  model_name=engine.model_name, max_model_len=engine.max_model_len,
                  vocab_size=engine.vocab_size)
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
  """Polls /metrics until nothing runs, waits or holds KV pages; returns the last scrape."""
  deadline = time.monotonic() + timeout
  while True:
    values = scrape_metrics(base_url)
    idle = (values["jaxserve_num_requests_running"] == 0
            and values["jaxserve_num_requests_waiting"] == 0
            and values["jaxserve_kv_pages_used"] == 0)
    if idle or time.monotonic() > deadline:
      return values
    time.sleep(0.05)
