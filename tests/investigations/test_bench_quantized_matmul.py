"""investigations/bench_quantized_matmul.py's device-independent rows on a tiny shape (the Pallas
rows need a GPU; scripts/gpu_quant.sh's mm steps run them): the two ceiling rows time the same
weight shape, and --trace adds a device time per projection to each row (and only then)."""

from __future__ import annotations

from investigations import bench_quantized_matmul as bench


def test_ceiling_rows_with_their_traced_device_time(monkeypatch):
  monkeypatch.setattr(bench, "SHAPES", {"tiny": (64, 256)})
  monkeypatch.setattr(bench, "LAYERS", 2)
  monkeypatch.setattr(bench, "INNER", 1)
  rows = bench.bench_shape("tiny", 4, None, False, [], ceiling=True, trace=True)
  assert [r["kind"] for r in rows] == ["ceiling xla row-sum int8", "ceiling cublas bf16 N/2"]
  for row in rows:
    assert row["us"] > 0 and row["device_us"] > 0
    assert (row["n"], row["k"], row["rows"]) == (64, 256, 4)
  untraced = bench.bench_shape("tiny", 4, None, False, [], ceiling=True)
  assert all("device_us" not in r for r in untraced)
