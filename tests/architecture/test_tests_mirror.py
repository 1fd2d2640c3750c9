"""tests/<folder> mirrors a package of jaxserve/, or is one of the few folders named for what
they test (TEST_FOLDERS_BEYOND_PACKAGES)."""

from __future__ import annotations

from tests.source_graph import PACKAGE, ROOT

TESTS = ROOT / "tests"

# tests/<folder> mirrors a package: jaxserve/<folder>, or one of these (named for what they test).
TEST_FOLDERS_BEYOND_PACKAGES = {
  "pallas_kernels": "the top-level kernels package",
  "investigations": "the top-level investigations folder",
  "integration": "engines end to end, across packages",
  "architecture": "the architecture's rules, across packages",
}


def test_the_tests_mirror_the_packages():
  folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
  packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
  assert folders - packages - set(TEST_FOLDERS_BEYOND_PACKAGES) == set()
  assert set(TEST_FOLDERS_BEYOND_PACKAGES) <= folders
