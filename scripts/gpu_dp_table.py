"""The short table of scripts/gpu_dp.sh, from the JSONs its steps left in OUT (one.json: one GPU,
dp2.json: --data-parallel-size 2, tp2.json: --tensor-parallel-size 2; a missing one is left out):
output tok/s at rate inf, dp2 over one GPU against the 1.9x target, TTFT / TPOT p50/p99 of dp2
and tp2 at each rate, the requests each engine core served, and whether the greedy requests
produced one GPU's tokens.

    python scripts/gpu_dp_table.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TARGET = 1.9  # dp2's output tok/s at rate inf over one GPU's


def _load(out: Path, name: str) -> dict | None:
  path = out / f"{name}.json"
  return json.loads(path.read_text()) if path.is_file() else None


def _run(result: dict, rate: str) -> dict | None:
  return next((r for r in result["runs"] if str(r["request_rate"]) == rate), None)


def _pair(metrics: dict, key: str) -> str:
  d = metrics[key]
  return f"{d['median_ms']:.1f}/{d['percentiles_ms']['p99']:.1f}"


def _throughput(result: dict) -> float | None:
  run = _run(result, "inf")
  return run["metrics"]["output_throughput"] if run else None


def _served(result: dict) -> str:
  return ", ".join(f"core {k}: {v:.0f}" for k, v in sorted(result["served_by_core"].items()))


def table(out: Path) -> str:
  results = {name: _load(out, name) for name in ("one", "dp2", "tp2")}
  lines = [
    f"{'config':<6}{'rate':>6}{'out tok/s':>11}{'TTFT p50/p99 ms':>20}"
    f"{'TPOT p50/p99 ms':>18}{'failed':>8}"
  ]
  for name, result in results.items():
    for run in (result or {}).get("runs", []):
      m = run["metrics"]
      lines.append(
        f"{name:<6}{str(run['request_rate']):>6}{m['output_throughput']:>11.0f}"
        f"{_pair(m, 'ttft'):>20}{_pair(m, 'tpot'):>18}{m['failed']:>8}"
      )
  one, dp2 = results["one"], results["dp2"]
  if one and dp2 and _throughput(one) and _throughput(dp2):
    ratio = _throughput(dp2) / _throughput(one)
    verdict = "meets" if ratio >= TARGET else "misses"
    lines.append(f"dp2 / one GPU at rate inf: {ratio:.2f}x ({verdict} the {TARGET}x target)")
  for name, result in results.items():
    if result and result.get("served_by_core"):
      parts = [
        f"rate {run['request_rate']}: {_served(run)}"
        for run in result["runs"]
        if run.get("served_by_core")
      ]
      parts.append(f"in all: {_served(result)}")
      lines.append(f"{name} requests served by engine core: {'; '.join(parts)}")
  for name in ("dp2", "tp2"):
    result = results[name]
    if one and result and one.get("greedy") and result.get("greedy"):
      same = sum(
        a["tokens"] == b["tokens"] for a, b in zip(one["greedy"], result["greedy"], strict=True)
      )
      lines.append(f"{name} greedy tokens as on one GPU: {same}/{len(one['greedy'])} requests")
  return "\n".join(lines)


if __name__ == "__main__":
  print(table(Path(sys.argv[1])))
