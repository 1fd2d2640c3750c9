"""One engine for the whole tests/server run, behind two real uvicorn servers: `server` with the
default settings and `strict_server` (API key, 2 KiB bodies, 2 waiting requests) on the same
engine thread."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.server.async_engine import AsyncEngine
from jaxserve.tokenizer.tokenizer import Tokenizer
from tests.server.server_helpers import RunningServer, build_server_engine, start_server

API_KEY = "test-secret-key"


@dataclass(frozen=True)
class Served:
  server: RunningServer
  async_engine: AsyncEngine
  engine: LLMEngine  # owned by the engine thread: tests read only its constants
  tokenizer: Tokenizer
  max_model_len: int

  @property
  def url(self) -> str:
    return self.server.url


@pytest.fixture(scope="session")
def served():
  engine = build_server_engine()
  async_engine = AsyncEngine(engine).start()
  server = start_server(async_engine, engine)
  yield Served(server, async_engine, engine, engine.tokenizer, engine.max_model_len)
  server.stop()
  async_engine.stop()


@pytest.fixture(scope="session")
def strict_server(served):
  server = start_server(served.async_engine, served.engine, api_key=API_KEY, max_body_bytes=2048,
                        max_waiting_requests=2)
  yield server
  server.stop()
