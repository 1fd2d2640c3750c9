"""scripts/gpu_tp4.sh parses (bash -n) and its table (scripts/gpu_tp4_table.py) sets the single
stream and each decode step beside one GPU's share of the weight read, with the all-reduces'
share of the step. (The steps themselves ran on 4 CPU devices on a tiny Llama when the script was
written; on GPUs they run at the 70B shape.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_script_parses():
  subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_tp4.sh")], check=True)


def test_the_table_sets_times_beside_a_gpus_share_of_the_weight_read(tmp_path):
  offline = dict(num_prompts=1, input_len=1024, output_len=256, device_ms_per_step=5.0)
  files = {
    "active.json": {"weight_bytes": 141e9, "active_weight_bytes": 120e9},
    "copy_bandwidth.json": {"copy_gb_per_s": 3000.0},  # 30 GB per GPU in 10 ms
    "tp4_tpot.json": dict(offline, output_tokens_per_s=50.0, kv_pool_tokens=1),  # 20 ms
    "steps_64.json": {
      "batch": 64,
      "context": 512,
      "rows": [{"tp": 4, "decode_ms_per_step": 25.0, "all_reduce_ms_per_step": 5.0}],
    },
    "fp8_off.json": dict(offline, num_prompts=1000, output_tokens_per_s=4000.0, kv_pool_tokens=9),
  }
  for name, result in files.items():
    (tmp_path / name).write_text(json.dumps(result))
  table = subprocess.run(
    [sys.executable, str(REPO / "scripts" / "gpu_tp4_table.py"), str(tmp_path), "4"],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  assert "tp4 single stream 1024/256: 20.00 ms/token = 2.00x the 10.00 ms weight read" in table
  assert "tp4 decode batch 64 (context 512): 25.00 ms/step = 2.50x the 10.00 ms" in table
  assert "all-reduces 5.00 ms (20% of the step)" in table
  assert "fp8 tp2 offline 1000 x 1024/256: 4000 out tok/s" in table
