"""The top level of jaxserve/ holds at most 6 modules, each named in TOP_LEVEL with why: everything
else lives in a named package."""

from __future__ import annotations

from tests.source_graph import PACKAGE

# The top level of jaxserve/ keeps what no package owns; everything else is in a named package.
TOP_LEVEL = {
  "__init__": "the package's face: LLM, SamplingParams, __version__",
  "version": "jaxserve's version (GET /version, the wheel's)",
}
MAX_TOP_LEVEL = 6


def test_the_top_level_holds_at_most_six_modules():
  assert len(TOP_LEVEL) <= MAX_TOP_LEVEL
  assert {path.stem for path in PACKAGE.glob("*.py")} == set(TOP_LEVEL)
