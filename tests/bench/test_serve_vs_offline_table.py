"""serve_vs_offline's short table (bench/serve_vs_offline_table.py): one row per load of a
result written out by hand, the ratio to LLM.generate's burst, each client process's CPU, and
the server's programs and start."""

from __future__ import annotations

from jaxserve.bench.serve_vs_offline_table import short_table


def _metrics(tok_s: float, ttft: tuple[float, float], tpot: tuple[float, float]) -> dict:
  def pair(p50: float, p99: float) -> dict:
    return {"median_ms": p50, "percentiles_ms": {"p50": p50, "p99": p99}}

  return {"output_throughput": tok_s, "failed": 0, "ttft": pair(*ttft), "tpot": pair(*tpot)}


def _run(rate, metrics: dict, shares: list[float]) -> dict:
  usages = [{"cpu_share": share} for share in shares]
  return {"request_rate": rate, "metrics": metrics, "client_processes": 4, "client_usages": usages}


RESULT = {
  "args": {
    "num_prompts": 1000,
    "input_len": 256,
    "output_len": 256,
    "sweep_input_len": 1024,
    "sweep_output_len": 128,
    "sweep_range_ratio": 0.5,
  },
  "offline": {"output_tokens_per_s": 15710.0, "defaults_for": "offline"},
  "servers": {
    "multi-process": {
      "started": {"health_s": 61.0, "programs": 83.0, "programs_compile_s": 48.25},
      "burst": _run(
        "inf", _metrics(15000.0, (3300.0, 10400.0), (24.0, 26.5)), [0.61, 0.58, 0.6, 0.55]
      ),
      "sweep": [_run(16.0, _metrics(1690.0, (52.0, 150.0), (10.4, 16.0)), [0.1] * 4)],
    }
  },
}


def test_one_row_per_load_with_the_ratio_to_llm_generate():
  lines = short_table(RESULT).splitlines()
  assert lines[2] == "| LLM.generate (offline defaults), 1000 x 256/256 | 15,710 | 1.000 | | | | |"
  assert lines[3] == (
    "| multi-process HTTP, burst, 4 client processes | 15,000 | 0.955 | 3300.0 / 10400.0 "
    "| 24.0 / 26.5 | 0.61/0.58/0.60/0.55 | 0 |"
  )
  assert lines[4] == (
    "| multi-process HTTP, rate 16.0 (1024/128, range 0.5), 4 client processes | 1,690 |  "
    "| 52.0 / 150.0 | 10.4 / 16.0 | 0.10/0.10/0.10/0.10 | 0 |"
  )
  assert lines[-1] == (
    "multi-process server: 83 step programs, the last compiled 48.2 s after the warmup's "
    "start; /health at 61.0 s"
  )
