"""investigations/ (one-off device investigations, not installed) may import jaxserve, never the
reverse: no jaxserve or pallas_kernels module imports it, and pip does not install it."""

from __future__ import annotations

import fnmatch

import tomllib

from tests.architecture.scopes import INVESTIGATIONS
from tests.source_graph import ROOT, forbidden_edges


def test_nothing_installed_imports_the_investigations(graph):
  assert (ROOT / "investigations" / "__init__.py").is_file()
  assert forbidden_edges(graph, ("jaxserve", "pallas_kernels"), INVESTIGATIONS) == []


def test_the_investigations_are_not_installed():
  find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
  include = find["find"]["include"]
  assert any(fnmatch.fnmatch("jaxserve.bench", pattern) for pattern in include)
  assert not any(
    fnmatch.fnmatch(name, pattern)
    for pattern in include
    for name in ("investigations", "investigations.bench_kernels")
  )
