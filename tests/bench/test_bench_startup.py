"""bench_startup end to end on the CPU with tiny-random: the report it writes (weight loads, the
KV pool the engine's own sizing gives, warmup) is what the H100 runs in docs/PERFORMANCE.md read."""

import json

from jaxserve.bench import bench_startup


def test_reports_loads_pool_and_warmup(tmp_path, capsys):
  out = tmp_path / "startup.json"
  assert (
    bench_startup.main(
      [
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "32",
        "--max-model-len",
        "64",
        "--load-runs",
        "1",
        "--warmup",
        "full",
        "--out",
        str(out),
      ]
    )
    == 0
  )
  report = json.loads(out.read_text())
  assert len(report["weight_loads"]) == 1 and report["weight_loads"][0]["bytes"] > 0
  pool = report["kv_pool"]
  assert pool["num_pages"] >= 2 and pool["max_model_len"] == 64
  assert pool["max_concurrency"] == (pool["num_pages"] - 1) * pool["page_size"] / 64
  assert report["warmup_s"] > 0
  printed = capsys.readouterr().out
  assert "KV pool" in printed and "best weight load" in printed


def test_no_weight_runs_still_reports_the_pool(tmp_path):
  out = tmp_path / "startup.json"
  assert (
    bench_startup.main(
      [
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "32",
        "--max-model-len",
        "64",
        "--load-runs",
        "0",
        "--out",
        str(out),
      ]
    )
    == 0
  )
  assert json.loads(out.read_text())["weight_loads"] == []
