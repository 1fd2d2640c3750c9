"""investigations/stacked_weights.py on tiny sizes: the three forms of a layer chain (an array a
layer, stacked and sliced, stacked under scan) compute the same output, each form passes the
buffers it should, and the KV forms donate 2L arrays or one."""

from __future__ import annotations

import json

from investigations import stacked_weights


def test_the_forms_agree_and_count_their_buffers(tmp_path):
  out = tmp_path / "stacked.json"
  assert stacked_weights.main(["--smoke", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  rows = {r["form"]: r for r in result["rows"]}
  assert {name: r["input_buffers"] for name, r in rows.items()} == {
    "separate": 9,  # x and 4 layers x 2 weights
    "static": 3,
    "scan": 3,
  }
  assert all(r["max_abs_diff_vs_separate"] < 1e-2 for r in rows.values())
  assert all(r["dispatch_us"] > 0 and r["step_us"] > 0 for r in rows.values())
  kv = {r["form"]: r["input_buffers"] for r in result["kv_rows"]}
  assert kv == {"kv separate": 8, "kv stacked": 1}
