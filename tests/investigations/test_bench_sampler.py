"""investigations/bench_sampler.py smoke run: every tile of the Pallas greedy kernel agrees with
XLA's reductions (interpret mode on CPU, compiled on a GPU, where gpu_session.sh's kernels step
runs this file)."""

from __future__ import annotations

import json

from investigations import bench_sampler


def test_bench_sampler_script_smoke(tmp_path):
  out = tmp_path / "sampler.json"
  assert (
    bench_sampler.main(
      [
        "--rows",
        "4",
        "--vocab",
        "300",
        "--tiles",
        "default,64:4:2:2",
        "--inner",
        "2",
        "--reps",
        "1",
        "--out",
        str(out),
      ]
    )
    == 0
  )
  results = json.loads(out.read_text())["results"]
  assert results and all(r["ids_match"] and r["max_lse_error"] < 1e-4 for r in results), results
