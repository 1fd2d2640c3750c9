"""The source's import graph, built once for the architecture's rules (it is only read)."""

from __future__ import annotations

import pytest

from tests.source_graph import import_graph


@pytest.fixture(scope="session")
def graph() -> dict[str, set[str]]:
  return import_graph()
