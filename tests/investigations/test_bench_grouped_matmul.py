"""investigations/bench_grouped_matmul.py on tiny shapes (CPU): every row timed, its bandwidth
counted from the experts the batch touches, and the grouped FFN equal to the dense reference
(scripts/gpu_moe.sh runs it at Qwen3-30B-A3B's shapes on a GPU)."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np

from investigations import bench_grouped_matmul as bench


def test_smoke_rows_and_the_dense_references_agree(tmp_path):
  out = tmp_path / "gmm.json"
  argv = ["--smoke", "--batches", "1,16", "--layers", "2", "--inner", "1", "--reps", "1"]
  assert bench.main([*argv, "--out", str(out)]) == 0
  report = json.loads(out.read_text())
  shape = bench.SMOKE
  for row in report["rows"]:
    assert 1 <= row["experts_touched"] <= shape.num_experts
    assert row["max_abs_error_vs_dense"] < 1e-6
    for kind in ("ragged_dot", "expert_ffn", "dense_all", "per_token_gather"):
      assert row[kind]["us"] > 0, kind
    ffn = row["expert_ffn"]
    assert np.isclose(ffn["gb_per_s"] * ffn["us"] * 1e3, row["experts_touched"] * 3 * 64 * 32 * 2)
  assert report["rows"][0]["experts_touched"] == shape.top_k  # one token: its own experts


def test_the_two_dense_references_agree_with_each_other():
  rng = np.random.default_rng(0)
  shape = bench.SMOKE
  ((gate, up, down),) = bench._experts(rng, shape, 1)
  ids, weights = bench._routing(rng, shape, 1, 5)
  x = jnp.asarray(rng.standard_normal((5, shape.hidden), dtype=np.float32), jnp.bfloat16)
  a = bench.dense_all(x, ids[0], weights[0], gate, up, down)
  b = bench.per_token_gather(x, ids[0], weights[0], gate, up, down)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
