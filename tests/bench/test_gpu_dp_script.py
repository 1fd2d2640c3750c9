"""scripts/gpu_dp.sh parses, runs its one-GPU and dp2 steps end to end on the CPU (tiny-random,
two forced host devices standing for the two GPUs, a few short requests), and its table
(scripts/gpu_dp_table.py) reads what the steps write: dp2 over one GPU against the 1.9x target,
dp2 against tp2 at both rates, the requests each core served, the greedy tokens compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_the_script_parses():
  subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_dp.sh")], check=True)


def test_the_one_gpu_and_dp2_steps_run_on_two_cpu_devices(tmp_path):
  config = tmp_path / "tiny.yaml"
  config.write_text(
    yaml.safe_dump(
      {
        "compilation_cache_dir": os.environ["JAXSERVE_TEST_XLA_CACHE"],
        "cache": {"page_size": 16, "num_pages": 256},
        "scheduler": {
          "max_num_seqs": 16,
          "max_num_batched_tokens": 64,
          "seq_buckets": [16],
          "token_buckets": [64],
        },
      }
    )
  )
  out = tmp_path / "out"
  env = dict(
    os.environ,
    MODEL="tiny-random",
    SHAPE="none",
    CONFIG=str(config),
    MAX_MODEL_LEN="256",
    N="8",
    RATE="8",
    RATE_S="1",
    GREEDY="2",
    STEPS="one dp2",
    OUT=str(out),
    LOGS=str(tmp_path / "logs"),
    RUN_FLAGS="--input-len 16 --output-len 8 --greedy-tokens 8",
    CLIENTS="1",
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2",
  )
  run = subprocess.run(
    ["bash", "scripts/gpu_dp.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
  )
  assert run.returncode == 0, run.stdout + run.stderr
  assert "=== one rc=0" in run.stdout and "=== dp2 rc=0" in run.stdout, run.stdout
  one, dp2 = (json.loads((out / f"{n}.json").read_text()) for n in ("one", "dp2"))
  for result in (one, dp2):
    assert result["exit_code"] == 0
    assert [r["request_rate"] for r in result["runs"]] == ["inf", 8.0]
    assert all(r["metrics"]["failed"] == 0 for r in result["runs"])
  assert dp2["health"] == {"status": "ok"}
  assert set(dp2["served_by_core"]) == {"0", "1"} and min(dp2["served_by_core"].values()) > 0
  assert "dp2 greedy tokens as on one GPU: 2/2 requests" in run.stdout
  assert "dp2 / one GPU at rate inf:" in run.stdout


def _result(name: str, tok_s: dict[str, float], tokens: list[list[str]]) -> dict:
  runs = []
  for rate, throughput in tok_s.items():
    latency = {"median_ms": 10.0, "percentiles_ms": {"p99": 20.0}}
    metrics = {"output_throughput": throughput, "failed": 0, "ttft": latency, "tpot": latency}
    runs.append({"request_rate": rate, "metrics": metrics, "served_by_core": {"0": 1, "1": 2}})
  greedy = [{"text": "".join(t), "tokens": t} for t in tokens]
  return {"name": name, "runs": runs, "greedy": greedy, "served_by_core": {"0": 3, "1": 4}}


def test_the_table_compares_dp2_with_one_gpu_and_tp2(tmp_path):
  files = {
    "one": _result("one", {"inf": 10000.0, 16.0: 3000.0}, [["a", "b"], ["c"]]),
    "dp2": _result("dp2", {"inf": 19500.0, 16.0: 3000.0}, [["a", "b"], ["x"]]),
    "tp2": _result("tp2", {"inf": 14000.0}, [["a", "b"], ["c"]]),
  }
  for name, result in files.items():
    (tmp_path / f"{name}.json").write_text(json.dumps(result))
  table = subprocess.run(
    [sys.executable, str(REPO / "scripts" / "gpu_dp_table.py"), str(tmp_path)],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  assert "dp2 / one GPU at rate inf: 1.95x (meets the 1.9x target)" in table
  assert "dp2      inf      19500           10.0/20.0         10.0/20.0       0" in table
  assert "tp2      inf      14000" in table and "dp2     16.0       3000" in table
  assert "dp2 greedy tokens as on one GPU: 1/2 requests" in table
  assert "tp2 greedy tokens as on one GPU: 2/2 requests" in table
  served = (
    "rate inf: core 0: 1, core 1: 2; rate 16.0: core 0: 1, core 1: 2; in all: core 0: 3, core 1: 4"
  )
  assert f"dp2 requests served by engine core: {served}" in table
