"""One engine core process for the whole tests/server run (as `jaxserve serve` runs it), behind
two real uvicorn servers, each an API server with its own CoreClient: `server` with the default
settings and `strict_server` (API key, 2 KiB bodies, 2 waiting requests)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from jaxserve.core.process import CoreHandle
from jaxserve.tokenizer.tokenizer import Tokenizer
from tests.server.server_helpers import (
  Backend,
  RunningServer,
  core_backend,
  start_core,
  start_server,
)

API_KEY = "test-secret-key"


@dataclass(frozen=True)
class Served:
  server: RunningServer
  backend: Backend
  core: CoreHandle
  tokenizer: Tokenizer
  max_model_len: int

  @property
  def url(self) -> str:
    return self.server.url


@pytest.fixture(scope="session")
def served():
  core = start_core()
  backend = core_backend(core)
  server = start_server(backend)
  yield Served(server, backend, core, backend.tokenizer, backend.max_model_len)
  server.stop()
  assert core.stop() == 0


@pytest.fixture(scope="session")
def strict_server(served):
  server = start_server(
    served.backend, api_key=API_KEY, max_body_bytes=2048, max_waiting_requests=2
  )
  yield server
  server.stop()
