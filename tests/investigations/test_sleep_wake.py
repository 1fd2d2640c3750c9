"""investigations/sleep_wake.py on the built-in model (CPU): the table and the JSON the H200 run
(scripts/gpu_startup.sh, step sl8b) writes, with the memory freed asleep and back after wake."""

from __future__ import annotations

import json
from pathlib import Path

from investigations.sleep_wake import main


def test_sleep_wake_measures_on_the_builtin_model(tmp_path: Path, capsys):
  out = tmp_path / "sleep_wake.json"
  argv = ["--max-model-len", "256", "--num-prompts", "2", "--prompt-len", "16", "--max-tokens", "4"]
  main([*argv, "--out", str(out)])
  result = json.loads(out.read_text())
  assert "compilations after wake" in capsys.readouterr().out
  assert result["same_greedy_tokens"] and result["compilations_after_wake"] == 0
  assert result["bytes_asleep"] < result["bytes_awake"] == result["bytes_woken"]
  assert len(result["tokens_before"]) == 2 and all(len(t) == 4 for t in result["tokens_before"])
