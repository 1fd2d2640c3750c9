"""investigations/layer_programs.py end to end on the built-in model (CPU): the forward of one
real decode step traced, lowered and compiled unrolled and as one program a layer, each twice;
both variants give the same step (XLA's scratch memory), and the program a layer is the smaller
module. It runs from the repository root, as investigations are run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_layer_programs_times_both_variants(tmp_path: Path):
  out = tmp_path / "layers.json"
  subprocess.run(
    [sys.executable, "-m", "investigations.layer_programs", "--num-seqs", "2", "--context", "16"]
    + ["--max-model-len", "128", "--reps", "2", "--log-level", "WARNING", "--out", str(out)],
    check=True,
    capture_output=True,
    timeout=600,
    cwd=ROOT,
  )
  result = json.loads(out.read_text())
  rows = result["rows"]
  assert result["num_seqs"] == 2 and result["phase"] == "decode"
  assert [row["variant"] for row in rows] == ["unrolled", "per_layer"] * 2
  assert all(row["device_ms"] > 0 and row["trace_s"] > 0 for row in rows)
  unrolled, per_layer = rows[0], rows[1]
  assert per_layer["temp_bytes"] == unrolled["temp_bytes"]
  assert per_layer["hlo_chars"] < unrolled["hlo_chars"]
