"""scripts/gpu_moe.sh parses (bash -n) and its table (scripts/gpu_moe_table.py) reads the results
its steps write: single-stream TPOT against the active weights' read time, the windows' speed-up,
the grouped-matmul columns (a failed one says so), how many requests of a two-device run
produced the one-device run's tokens.
(The steps themselves ran on CPU on tiny checkpoints when the script was written; on a GPU they
run at the named shapes.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_script_parses():
  subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_moe.sh")], check=True)


def _offline(n: int, inp: int, out: int, tok_s: float) -> dict:
  return dict(
    num_prompts=n,
    input_len=inp,
    output_len=out,
    output_tokens_per_s=tok_s,
    device_ms_per_step=10.0,
    kv_pool_tokens=1000,
  )


def test_the_table_compares_tpot_with_the_active_read_time_and_windows_on_with_off(tmp_path):
  files = {
    "moe_tpot.json": _offline(1, 1024, 256, 200.0),  # 5 ms per token
    "moe_active.json": {"weight_bytes": 61e9, "active_weight_bytes": 6e9},
    "copy_bandwidth.json": {"copy_gb_per_s": 3000.0},  # 6 GB in 2 ms
    "gemma_tpot.json": _offline(1, 1024, 256, 100.0),  # 10 ms per token
    "gemma_active.json": {"weight_bytes": 24e9, "active_weight_bytes": 24e9},
    "gemma_1k_on.json": _offline(1000, 1024, 128, 3000.0),
    "gemma_1k_off.json": _offline(1000, 1024, 128, 2000.0),
    "moe_one.json": dict(_offline(3, 256, 256, 900.0), token_digests=["a", "b", "c"]),
    "moe_ep2.json": dict(_offline(3, 256, 256, 1000.0), token_digests=["a", "x", "c"]),
    "moe_one_inv_tp.json": dict(_offline(3, 256, 256, 500.0), token_digests=["d", "e", "f"]),
    "moe_tp2_inv.json": dict(_offline(3, 256, 256, 600.0), token_digests=["d", "e", "f"]),
    "moe_nc_256_256_fp8.json": _offline(1000, 256, 256, 9000.0),  # qoff256:256:1000:fp8
    "gmm.json": {
      "device": "NVIDIA H100",
      "shape": {"num_experts": 128},
      "rows": [
        {
          "tokens": 1,
          "experts_touched": 8.0,
          "copy_gb_per_s": 2900.0,
          "ragged_dot": {"us": 150.0, "gb_per_s": 166.0},
          "pallas": {"us": 12.0, "gb_per_s": 2100.0},
          "dense_all": {"error": "RESOURCE_EXHAUSTED"},
        }
      ],
    },
  }
  for name, result in files.items():
    (tmp_path / name).write_text(json.dumps(result))
  table = subprocess.run(
    [sys.executable, str(REPO / "scripts" / "gpu_moe_table.py"), str(tmp_path)],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  assert "5.00 ms/token vs 2.00 ms to read the 6.00 GB one token reads" in table
  assert "at 3000 GB/s (2.50x)" in table
  assert "windows on / off: 1.50x" in table
  assert "gemma-3-12b single stream 1024/256: 10.00 ms/token vs 8.00 ms" in table
  assert "gemma-3-12b 1000 x 1024/128 windows off: 2000 out tok/s" in table
  assert "qwen3-30b-a3b ep2 3 x 256/256: 1000 out tok/s" in table
  assert "qwen3-30b-a3b nc_256_256_fp8 1000 x 256/256: 9000 out tok/s" in table
  assert "tokens as on one device: 2/3 requests" in table
  # an invariant run is compared with the one-device run cut as it cuts the experts
  assert "tp2_inv 3 x 256/256: 600 out tok/s, 10.00 device ms/step, KV pool 1000 tokens, " in table
  assert "tp2_inv" in table and "tokens as on one device: 3/3 requests" in table
  assert "ragged_dot 150 us 166 GB/s, pallas 12 us 2100 GB/s, dense_all error" in table
