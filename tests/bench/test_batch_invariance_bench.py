"""The batch-invariance diagnostic on CPU with tiny-random: with batch_invariant on it reports
every probe identical (tokens and logprobs, bitwise) in every scenario, preemption happened,
and every component check of the configured step is bitwise equal across buckets."""

from __future__ import annotations

import json

from jaxserve.bench import batch_invariance

ARGS = [
  "--num-probes",
  "3",
  "--num-tokens",
  "8",
  "--num-others",
  "10",
  "--min-len",
  "20",
  "--max-len",
  "60",
  "--set",
  "scheduler.max_num_seqs=8",
  "--set",
  "scheduler.max_num_batched_tokens=64",
  "--set",
  "scheduler.token_buckets=[16,64]",  # two rungs: a chunk of 16 rows against the full 64
  "--set",
  "compilation_cache_dir=null",
  "--components",
  "configured",  # the configured step's GEMM formulation: what the assertions below check
]


def test_reports_all_identical_with_batch_invariant_on(tmp_path):
  out = tmp_path / "invariance.json"
  result = batch_invariance.main(ARGS + ["--batch-invariant", "on", "--out", str(out)])
  assert json.loads(out.read_text())["batch_invariant"] is True
  scenarios = result["scenarios"]
  assert set(scenarios) == {"crowd", "preempt", "prefix"}
  assert scenarios["preempt"]["num_preemptions"] > 0
  for name, entry in scenarios.items():
    assert entry["num_tokens_identical"] == 3, name
    assert entry["num_logprobs_bitwise"] == 3, name
    assert all(p["first_differing_token"] is None for p in entry["probes"]), name
  components = result["components"]
  configured = {
    k: v
    for k, v in components.items()
    if k.endswith("/configured") or k.startswith(("attention/", "rmsnorm"))
  }
  assert len(configured) >= 10
  for name, entry in configured.items():
    assert set(entry["differing_rows"].values()) == {0}, name
