"""Fixtures shared by the benchmark tests."""

from __future__ import annotations

import pytest

from tests.server.server_helpers import (
  core_backend,
  server_engine_config,
  start_core,
  start_server,
)


@pytest.fixture(scope="module")
def server_url():
  """A real uvicorn server over a small tiny-random engine core, one per test module; its
  programs compile as a module's requests first need them."""
  core = start_core(server_engine_config(warmup="lazy"))
  server = start_server(core_backend(core))
  yield server.url
  server.stop()
  core.stop()
