"""`python -m jaxserve.bench.serve_vs_offline` end to end on tiny-random (the GPU step svo8b runs
it on the 8B checkpoint): bench_offline, then both servers under the burst, a sweep and a single
stream, one JSON, one plot and the table."""

from __future__ import annotations

import json

import yaml

from jaxserve.bench.serve_vs_offline import main
from tests.server.server_helpers import free_port
from tests.tools.png_checks import assert_valid_png


def test_serve_vs_offline_runs_both_servers(tmp_path, capsys):
  config = tmp_path / "tiny.yaml"
  config.write_text(
    yaml.safe_dump(
      {
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
  code = main(
    [
      "--model",
      "tiny-random",
      "--config",
      str(config),
      "--max-model-len",
      "256",
      "--num-prompts",
      "12",
      "--input-len",
      "16",
      "--output-len",
      "8",
      "--sweep-rates",
      "20,inf",
      "--sweep-input-len",
      "24",
      "--sweep-output-len",
      "6",
      "--sweep-seconds",
      "0.5",
      "--sweep-inf-prompts",
      "6",
      "--single-stream-prompts",
      "2",
      "--client-processes",
      "2",
      "--port",
      str(free_port()),
      "--out-dir",
      str(out),
    ]
  )
  assert code == 0
  result = json.loads((out / "serve_vs_offline.json").read_text())
  assert result["offline"]["output_tokens"] == 12 * 8
  assert result["offline"]["defaults_for"] == "serve"  # the servers' scheduler, not LLM's
  assert set(result["servers"]) == {"multi-process", "single-process"}
  for server in result["servers"].values():
    burst = server["burst"]["metrics"]
    assert burst["completed"] == 12 and burst["failed"] == 0
    assert burst["total_output_tokens"] == 12 * 8
    assert [run["request_rate"] for run in server["sweep"]] == [20.0, "inf"]
    assert [run["metrics"]["completed"] for run in server["sweep"]] == [10, 6]
    assert server["single_stream"]["metrics"]["completed"] == 2
    assert server["exit_code"] == 0
    assert 0 < server["started"]["health_s"] <= server["started"]["all_api_servers_s"]
  multi = result["servers"]["multi-process"]["burst"]["server_cpu"]
  assert set(multi) >= {"supervisor", "core", "api-0"}  # every process of the tree, by role
  assert multi["core"] > 0.05  # the engine stepped for the whole burst
  assert set(result["servers"]["single-process"]["burst"]["server_cpu"]) == {"supervisor"}
  assert_valid_png(out / "sweep_throughput_latency.png")
  table = capsys.readouterr().out
  assert "multi-process HTTP, burst" in table and "single-process HTTP, burst" in table
  assert "multi-process server CPU in the burst (cores): supervisor" in table
