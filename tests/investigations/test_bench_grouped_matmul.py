"""investigations/bench_grouped_matmul.py on tiny shapes (CPU, the Pallas kernel in interpret
mode): every row timed, its bandwidth counted from the experts the batch touches, the grouped
FFNs equal to the dense reference and the kernel's product to ragged_dot's, a failing column
recorded beside the others (scripts/gpu_moe.sh runs it at Qwen3-30B-A3B's shapes on a GPU).

One smoke run is shared by the module's tests: each program compiles once (the interpret-mode
kernel's are the cost), and the tiling sweep and the failing-column run at its first batch reuse
them (the bench builds a program once per function)."""

from __future__ import annotations

import contextlib
import io
import json

import jax.numpy as jnp
import numpy as np
import pytest

from investigations import bench_grouped_matmul as bench
from pallas_kernels.grouped_matmul.gpu import Tiling

SMOKE_ARGV = ["--smoke", "--batches", "1,16", "--layers", "2", "--inner", "1", "--reps", "1"]
SWEEP = "16,16,16,2,4,4;16,64,16,1,4,4"  # the second's block_n does not divide N (32)


def _main(out, *argv: str) -> tuple[dict, str]:
  """bench.main's JSON report and what it printed."""
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    assert bench.main([*SMOKE_ARGV, *argv, "--out", str(out)]) == 0
  return json.loads(out.read_text()), printed.getvalue()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:
  """The smoke run's JSON report."""
  report, _ = _main(tmp_path_factory.mktemp("gmm") / "gmm.json")
  return report


def test_smoke_rows_and_the_dense_references_agree(smoke):
  report = smoke
  shape = bench.SMOKE
  for row in report["rows"]:
    assert 1 <= row["experts_touched"] <= shape.num_experts
    assert row["max_abs_error_vs_dense"] < 1e-6
    assert row["ragged_max_abs_error_vs_dense"] < 1e-6
    assert row["pallas_max_abs_error_vs_ragged"] < 2e-2  # bfloat16 rows, summed in its own order
    for kind in bench.KINDS:
      assert row[kind]["us"] > 0, kind
    for kind in ("expert_ffn", "expert_ffn_ragged"):
      ffn = row[kind]
      touched_bytes = row["experts_touched"] * 3 * 64 * 32 * 2
      assert np.isclose(ffn["gb_per_s"] * ffn["us"] * 1e3, touched_bytes)
    assert np.isclose(
      row["pallas"]["gb_per_s"] * row["pallas"]["us"],
      row["ragged_dot"]["gb_per_s"] * row["ragged_dot"]["us"],
    )  # the same gate weights read
  assert report["rows"][0]["experts_touched"] == shape.top_k  # one token: its own experts


def test_a_failing_column_records_its_error(smoke, monkeypatch, capsys):
  """The smoke run's first batch and layers again (its programs compiled), dense_all failing."""

  def fail(*_args, **_kwargs):
    raise MemoryError("RESOURCE_EXHAUSTED: out of memory")

  real = bench.ffn_program
  monkeypatch.setattr(bench, "ffn_program", lambda fn: fail if fn is bench.dense_all else real(fn))
  args = bench.parse_args(SMOKE_ARGV)
  row = bench.bench_batch(bench.SMOKE, 1, args, copy_gbps=1.0)
  assert "RESOURCE_EXHAUSTED" in row["dense_all"]["error"]
  assert row["expert_ffn"]["us"] > 0 and row["pallas"]["us"] > 0
  assert row["max_abs_error_vs_dense"] is None  # no reference to check against
  assert row["pallas_max_abs_error_vs_ragged"] < 2e-2
  assert "error" in bench._table([row]) and "dense_all" in capsys.readouterr().err


def test_the_two_dense_references_agree_with_each_other():
  rng = np.random.default_rng(0)
  shape = bench.SMOKE
  ((gate, up, down),) = bench._experts(shape, 1)
  ids, weights = bench._routing(rng, shape, 1, 5)
  x = jnp.asarray(rng.standard_normal((5, shape.hidden), dtype=np.float32), jnp.bfloat16)
  a = bench.dense_all(x, ids[0], weights[0], gate, up, down)
  b = bench.per_token_gather(x, ids[0], weights[0], gate, up, down)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_fused_times_the_ffn_through_the_routing_kernel_and_the_sorted_rows(tmp_path):
  """--fused: the routed FFN (routing kernel, gathered and scattered products) and the sorted one
  (sort, copy, inverse permutation), both the Pallas kernel, beside the others, each equal to the
  dense reference to bfloat16 rounding; --ffn-tilings times the routed FFN per pair of tilings (a
  pair whose block_m differ records its error)."""
  sweep = "16,16,32,2,4,4/16,32,16,1,4,4;16,16,16,1,4,4/32,32,16,1,4,4"  # 2nd: two block_m
  report, printed = _main(
    tmp_path / "gmm.json", "--batches", "1", "--fused", "--ffn-tilings", sweep
  )
  (row,) = report["rows"]
  for kind in bench.FUSED_KINDS:
    assert row[kind]["us"] > 0 and kind in printed
    assert row[f"{kind}_max_abs_error_vs_dense"] < 2e-2
  swept = row["routed_tilings"]
  assert swept["16x16x32/2 w4 s4 / 16x32x16/1 w4 s4"]["us"] > 0
  assert "routing: expected" in swept["16x16x16/1 w4 s4 / 32x32x16/1 w4 s4"]["error"]
  assert "routed FFN 16x16x32/2 w4 s4 / 16x32x16/1 w4 s4:" in printed


def test_a_tiling_sweep_times_the_kernel_per_tiling(smoke, tmp_path):
  """Each tiling on the gate product and the fused SwiGLU; one that does not divide the smoke
  shape's N (32) records its error. At the smoke run's first batch (only the tiled programs
  compile)."""
  assert bench.parse_tilings(SWEEP)[0] == Tiling(16, 16, 16, 2, 4, 4)
  report, printed = _main(tmp_path / "gmm.json", "--batches", "1", "--tilings", SWEEP)
  assert "pallas gate 16x16x16/2 w4 s4:" in printed
  swept = report["rows"][0]["pallas_tilings"]
  assert swept["gate 16x16x16/2 w4 s4"]["us"] > 0 and swept["swiglu 16x16x16/2 w4 s4"]["us"] > 0
  assert "N 32 must be a multiple of block_n" in swept["gate 16x64x16/1 w4 s4"]["error"]


def test_fp8_smoke_counts_the_e4m3_bytes(tmp_path):
  """--fp8 block: the routed FFN on fp8 experts (whole 128-blocks: SMOKE_FP8), the fp8 kernel's
  gate product equal to the fp8 ragged_dot path's, and the bandwidth counted from the e4m3 bytes
  and block scales the batch touches; --ffn-tilings times the fp8 routed FFN per tiling pair."""
  sweep = "16,128,128,1,4,3/16,128,128,1,4,4"
  report, printed = _main(
    tmp_path / "fp8.json", "--fp8", "block", "--batches", "1", "--ffn-tilings", sweep
  )
  swept = report["rows"][0]["routed_tilings"]["16x128x128/1 w4 s3 / 16x128x128/1 w4 s4"]
  assert swept["us"] > 0 and "routed FFN 16x128x128/1 w4 s3" in printed
  shape = bench.SMOKE_FP8
  assert report["shape"]["fp8"] == "block"
  (row,) = report["rows"]
  assert row["pallas_max_abs_error_vs_ragged"] < 2e-2  # bfloat16 outputs, summed in its own order
  assert row["max_abs_error_vs_dense"] < 0.1  # the bf16 reference's activations are unquantized
  touched_bytes = row["experts_touched"] * (3 * 256 * 128 + 4 * 3 * 2)  # e4m3, 2 blocks each
  assert shape.top_k == row["experts_touched"]
  ffn = row["expert_ffn"]
  assert np.isclose(ffn["gb_per_s"] * ffn["us"] * 1e3, touched_bytes)
  assert "'fp8': 'block'" in printed
