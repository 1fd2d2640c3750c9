"""investigations/bench_kernels.py and its harnesses (investigations/kernel_timing.py): the smoke
run checks every kernel against the reference, a prefill case, the FLOP count, each timing
harness and the device-time column; interpret mode on CPU, compiled on a GPU (gpu_session.sh's
kernels step runs this file there).

One smoke run with a prefill case and the device-time column is shared by the tests that read
them: the interpret-mode kernels and their timing programs compile once."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from investigations import attention_report, bench_kernels, kernel_timing
from pallas_kernels.ragged_paged_attention.reference import ragged_paged_attention_reference


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory) -> dict:
  """The smoke run's JSON: its decode and mixed cases, a prefill case, device time."""
  out_path = tmp_path_factory.mktemp("bench") / "bench.json"
  argv = ["--smoke", "--prefill", "2x24", "--device-time", "--out", str(out_path)]
  assert bench_kernels.main(argv) == 0
  return json.loads(out_path.read_text())


def test_bench_script_smoke(smoke_report: dict):
  report = smoke_report
  names = [case["name"] for case in report["cases"]]
  assert report["smoke"] and names == [
    "decode_b2_ctx32",
    "mixed_1x8prefill_2decode_ctx32",
    "prefill_2x24",
  ], report
  assert report["copy_gbps"] > 0 and report["read_gbps"] > 0, report
  for case in report["cases"]:
    assert case["error"] is None, case
    assert not any("failed" in note for note in case["notes"]), case
    assert case["max_abs_error"]["ours"] < 2e-2, case
  assert report["cases"][1]["kind"] == "mixed"
  assert report["cases"][0]["max_abs_error"]["bundled"] < 2e-2


def test_bench_script_prefill_case(smoke_report: dict):
  prefill = smoke_report["cases"][-1]
  assert prefill["name"] == "prefill_2x24"
  assert prefill["error"] is None and prefill["num_tokens"] == 48, prefill
  assert prefill["max_abs_error"]["ours"] < 2e-2


def test_bench_script_fp8_pages(tmp_path: Path):
  out_path = tmp_path / "bench.json"
  argv = ["--smoke", "--no-mixed", "--kv-dtype", "float8_e4m3fn", "--out", str(out_path)]
  assert bench_kernels.main(argv) == 0
  (case,) = json.loads(out_path.read_text())["cases"]
  assert case["error"] is None and not case["notes"], case
  assert set(case["max_abs_error"]) == {"ours"} and case["max_abs_error"]["ours"] < 2e-2, case
  assert case["kv_bytes"] == 2 * 32 * 2 * 64 * 2  # 2 seqs x 32 tokens, 1-byte K and V rows


def test_attention_flops_by_hand():
  # one prompt of 3 tokens from an empty cache (6 causal pairs) and one decode token over 5
  # (5 pairs): 4 FLOPs x 2 q heads x 8 dims per pair
  batch = kernel_timing.make_batch(
    "b",
    kernel_timing.Shape(num_q_heads=2, num_kv_heads=1, head_dim=8),
    [3, 1],
    [3, 5],
    seed=0,
    num_rotations=1,
  )
  assert attention_report.attention_flops(batch) == 4 * 2 * 8 * (6 + 5)


@pytest.mark.parametrize("harness", ["unrolled", "loop", "marginal"])
def test_bench_harness_times(harness):
  batch = kernel_timing.make_batch(
    "b", kernel_timing.Shape(), [1] * 4, [40] * 4, seed=0, num_rotations=2
  )
  fn = functools.partial(ragged_paged_attention_reference, sm_scale=0.1)
  seconds = kernel_timing.time_per_call(fn, batch, inner=3, reps=3, harness=harness)
  assert 0 < seconds < 1 if harness != "marginal" else 0 <= seconds < 1  # a difference of medians


def test_unrolled_bench_program_runs_every_call():
  """Each of the `inner` calls returns its own output, computed on its own query and its own
  block table (so XLA can neither drop calls nor share work between them); a table holds the
  pages of one rotation."""
  batch = kernel_timing.make_batch(
    "b", kernel_timing.Shape(), [1] * 4, [40] * 4, seed=0, num_rotations=2
  )
  fn = functools.partial(ragged_paged_attention_reference, sm_scale=0.1)
  program, args = kernel_timing.unrolled_program(fn, batch, 5)
  outputs = program(*args)
  queries, tables = args[0], args[4]
  assert len(outputs) == 5 and len({float(jnp.sum(q)) for q in queries}) == 5
  assert len({np.asarray(t).tobytes() for t in tables}) == 5
  for i, table in enumerate(tables):
    rotation = np.asarray(batch.block_tables[i % 2])
    assert sorted(np.asarray(table).ravel()) == sorted(rotation.ravel())
  for i, out in enumerate(outputs):
    expected = fn(
      queries[i],
      batch.k_pool,
      batch.v_pool,
      batch.kv_slot,
      tables[i],
      batch.seq_lens,
      batch.query_start_loc,
      batch.num_seqs,
    )
    np.testing.assert_allclose(
      np.asarray(out, np.float32), np.asarray(expected, np.float32), atol=1e-2
    )


def test_bench_device_time_column(smoke_report: dict):
  """--device-time traces the timed program and reports its kernels' time per call."""
  case = smoke_report["cases"][0]
  assert case["device_us"]["ours"] > 0, case
  assert not any("trace failed" in note for note in case["notes"]), case
