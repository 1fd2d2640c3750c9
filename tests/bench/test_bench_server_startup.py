"""bench_server_startup on tiny-random: a real `jaxserve serve` (warmup background) answers
/health 200 before all its step programs are compiled, serves the probe with the same text as
once everything is compiled and after a restart, and its mixed workload compiles nothing; the
restart loads its programs from the compilation cache; the TPOT probes stream at /health and once
all is compiled."""

from __future__ import annotations

import json

from jaxserve.bench import bench_server_startup


def test_fresh_start_workload_and_restart(tmp_path, monkeypatch):
  for name in (
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
  ):
    monkeypatch.delenv(name, raising=False)  # the servers use the bench's empty cache
  out = tmp_path / "startup.json"
  assert (
    bench_server_startup.main(
      [
        "--model",
        "tiny-random",
        "--max-model-len",
        "256",
        "--cache-dir",
        str(tmp_path / "xla"),
        "--set",
        "scheduler.max_num_seqs=8",
        "--set",
        "scheduler.max_num_batched_tokens=64",
        "--set",
        "scheduler.token_buckets=[16,64]",
        "--workload-s",
        "3",
        "--concurrency",
        "4",
        "--max-prompt",
        "40",
        "--max-output",
        "32",
        "--tpot-probes",
        "1x16/8,2x24/6",
        "--out",
        str(out),
      ]
    )
    == 0
  )
  report = json.loads(out.read_text())
  fresh, restart = report["fresh"], report["restart"]
  # The server logs what it compiled before it turned ready; /metrics, read a moment later,
  # may already show the background thread done, so only the log line is deterministic.
  compiled, total = map(int, fresh["log"]["warmup_first"].split(" programs")[0].split(" of "))
  assert 0 < compiled < total  # ready with the largest bucket's programs only
  assert fresh["probe_text"] == fresh["probe_text_all_compiled"] != ""
  assert fresh["workload"]["ok"] > 0 and fresh["workload"]["failed"] == 0
  assert fresh["workload"]["compilations"] == 0
  for phase in ("tpot_at_ready_ms", "tpot_all_compiled_ms"):
    assert set(fresh[phase]) == {"1x16/8", "2x24/6"} and min(fresh[phase].values()) > 0
  assert restart["same_probe_text"]
  assert restart["log"]["cache_use"].endswith(" 0 compiled")
  assert int(restart["log"]["cache_use"].split(" programs read")[0]) > 0  # the program store's
