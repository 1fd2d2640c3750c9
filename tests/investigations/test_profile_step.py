"""investigations/profile_step.py end to end on the built-in model (CPU): the step's parts are
timed, the trace is summarized, and --trace-ops describes the top instructions from the step's own
compiled HLO. It runs from the repository root, as investigations are run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_profile_step_with_trace_ops(tmp_path: Path):
  out = tmp_path / "profile.json"
  subprocess.run(
    [
      sys.executable,
      "-m",
      "investigations.profile_step",
      "--num-seqs",
      "4",
      "--context",
      "16",
      "--max-model-len",
      "128",
      "--trace-top",
      "5",
      "--trace-ops",
      "--trace-reps",
      "2",
      "--log-level",
      "WARNING",
      "--out",
      str(out),
    ],
    check=True,
    capture_output=True,
    timeout=600,
    cwd=ROOT,
  )
  result = json.loads(out.read_text())
  assert result["bucket"]["num_seqs"] >= 4 and all(ms > 0 for ms in result["parts_ms"].values())
  assert result["num_seqs"] == result["asked_num_seqs"] == 4
  assert result["trace"]["device_us_per_step"] > 0
  ops = result["trace_ops"]
  assert len(ops) == 5 and all(op["hlo"] is not None for op in ops)  # CPU ops are all the step's
  assert any("/jit(decoder_layer)/" in op["hlo"]["op_name"] for op in ops)  # a decoder layer's op
