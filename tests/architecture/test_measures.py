"""docs/ARCHITECTURE.md's "The tree in numbers" states this tree's numbers (tests/architecture/
measures.py counts them), and what issue 57 brought down stays down (CEILINGS). The rules that
already hold a number (at most 6 top-level modules, configuration only in config/, one
subcommand dispatch, the layers) are their own modules'; these are the counts no rule holds."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from tests.architecture.measures import measures
from tests.architecture.test_layers import LAYERS
from tests.architecture.walk import WALK_HEADING, Tree, walk_files
from tests.source_graph import ROOT

HEADING = "## The tree in numbers"
# Counts that move with the measurements a run records: the table gives them on its date, and
# only their ceilings are checked.
DRIFTING = frozenset(
  {"docs/PERFORMANCE.md lines", "docs/PERFORMANCE.md headings", "result files under docs/"}
)
CEILINGS = {
  "request records": 2,  # the wire's EngineCoreRequest, the core's Request (sharing its ids)
  "copies of a prompt's ids": 1,  # the tokenizer's list made one tuple
  "checks of a prompt's ids": 1,  # engine/core_io.new_core_requests
  "LLMEngine arguments restating EngineCore's": 0,  # it takes the core
  "files naming mixtral": 3,  # a family: its module, its registry line, named_shapes.py's shape
  "files naming qwen3_moe": 3,  # and named_shapes.py's qwen3-30b-a3b
  "files naming gemma": 5,  # and the shared GemmaRMSNorm, models/__init__.py's export
  "docs/PERFORMANCE.md lines": 1_500,  # today's figures, not a journal (3,160 lines before)
}


@functools.cache
def measured() -> dict[str, int]:
  return measures(Tree(ROOT))


def stated(doc: Path = ROOT / "docs" / "ARCHITECTURE.md") -> dict[str, int]:
  """The table's rows: what -> its number today (the table's last column)."""
  section = doc.read_text().split(HEADING, 1)[1].split("\n## ", 1)[0]
  rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
  return {
    cells[0].strip(): int(cells[-1].strip().replace(",", ""))
    for cells in rows[1:]  # the header
    if re.fullmatch(r"[\d,]+", cells[-1].strip())
  }


def test_the_table_states_todays_numbers():
  table, counts = stated(), measured()
  assert set(table) == set(counts)
  assert {k: v for k, v in table.items() if k not in DRIFTING} == {
    k: v for k, v in counts.items() if k not in DRIFTING
  }


def listed_walk(doc: Path = ROOT / "docs" / "ARCHITECTURE.md") -> tuple[list[str], dict[str, int]]:
  """The files the section's floor-by-floor block lists, and the layer it gives each package: a
  line gives a layer, a folder (relative to jaxserve/, or pallas_kernels/...) and file names, a
  line without a layer a subfolder, a line without a folder more names in the folder before."""
  section = doc.read_text().split(HEADING, 1)[1].split("\n## ", 1)[0]
  block = section.split("```")[-2]
  files, layers, folder = [], {}, ""
  for line in block.strip().splitlines():
    match = re.match(r"\s*(\d+\s+)?(\S+/)\s+(.*)", line)
    if match:
      folder = match.group(2)
      package = folder.split("/")[0]
      if package != "pallas_kernels":
        folder, package = "jaxserve/" + folder, "jaxserve." + package
      if match.group(1):
        layers[package] = int(match.group(1))
    files += [folder + name for name in (match.group(3) if match else line).split()]
  return sorted(files), layers


def test_the_floors_list_the_walks_files():
  files, layers = listed_walk()
  assert files == walk_files(Tree(ROOT))
  assert layers == {p: i for i, packages in enumerate(LAYERS) for p in packages if p in layers}


def test_the_numbers_stay_within_their_ceilings():
  counts = measured()
  assert set(CEILINGS) <= set(counts)
  assert {k: counts[k] for k, limit in CEILINGS.items() if counts[k] > limit} == {}


def test_the_counts_see_what_they_count(tmp_path):
  """On a small tree as the source was before issue 57: a spec and a record, each copying the
  ids, a check at the handler and one in the core, a family named in three modules' code (and
  in a docstring, which is not code), the engine restating the core's arguments."""
  files = {
    "docs/ARCHITECTURE.md": f"{WALK_HEADING}\n1. `server/app.build_app`, `CoreClient.add`.\n"
    "2. core/streams.py, then engine/engine_core.py.\n9. Kernel: kernel.py.\n"
    "13. Text.\n## Next\n",
    "docs/PERFORMANCE.md": "# Performance\n## A\nline\n",
    "docs/results/run.json": "{}",
    "jaxserve/__init__.py": "",
    "jaxserve/config_loader.py": "import yaml\n",
    "jaxserve/server/app.py": "def build_app(prompt):\n  check_token_ids(prompt, 9)\n",
    "jaxserve/core/client.py": "class CoreClient:\n  def add(self, s):\n"
    "    return tuple(s.prompt_token_ids), list(s.prompt_token_ids[1:])\n",
    "jaxserve/core/streams.py": '"""Mixtral, in prose."""\n'
    "class RequestSpec:\n  prompt_token_ids: tuple[int, ...]\n",
    "jaxserve/engine/engine_core.py": "class EngineCore:\n"
    "  def __init__(self, *, runner, seed=0): ...\n"
    "  def add_request(self, spec, prompt_ids):\n    check_token_ids(prompt_ids, 9)\n"
    "    return Request(list(spec.prompt_token_ids))\n"
    "class Request:\n  prompt_token_ids: list[int]\n",
    "jaxserve/engine/llm_engine.py": "class LLMEngine:\n"
    "  def __init__(self, *, tokenizer, runner, seed=0): ...\n",
    "jaxserve/api/outputs.py": "class RequestOutput:\n  prompt_token_ids: tuple\n",
    "jaxserve/models/names.py": 'ARCH = "MixtralForCausalLM"\n',
    "jaxserve/models/weights.py": "def load(mixtral_names): ...\n",
    "jaxserve/models/hf.py": "from jaxserve.models import mixtral\n",
    "pallas_kernels/kernel.py": "",
  }
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  expected = {
    "files from server/app.py to the kernel": 5,
    "request records": 2,
    "copies of a prompt's ids": 2,
    "checks of a prompt's ids": 2,
    "LLMEngine arguments restating EngineCore's": 2,
    "modules at jaxserve/'s top level": 2,
    "configuration places": 2,
    "files naming mixtral": 3,
    "docs/PERFORMANCE.md lines": 3,
    "docs/PERFORMANCE.md headings": 2,
    "result files under docs/": 1,
  }
  counts = measures(Tree(tmp_path))
  assert {k: counts[k] for k in expected} == expected
