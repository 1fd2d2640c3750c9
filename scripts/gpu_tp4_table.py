"""The short table of scripts/gpu_tp4.sh: one line per result its steps left in OUT (a missing
result is left out). The single stream's time per token is set beside the read time of one GPU's
share of the weights a token reads (the active bytes / TP, at the card's copy bandwidth), and each
decode step beside the same read time, with the all-reduces' share of the step.

    python scripts/gpu_tp4_table.py OUT [TP]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(out: Path, name: str) -> dict | None:
  path = out / name
  return json.loads(path.read_text()) if path.is_file() else None


def read_ms(out: Path, tp: int) -> float | None:
  """The read time of one GPU's share of the weights one decode token reads, in ms."""
  active, copy = _load(out, "active.json"), _load(out, "copy_bandwidth.json")
  if not (active and copy):
    return None
  return active["active_weight_bytes"] / tp / (copy["copy_gb_per_s"] * 1e9) * 1e3


def lines(out: Path, tp: int) -> list[str]:
  rows, read = [], read_ms(out, tp)
  beside = lambda ms: f" = {ms / read:.2f}x the {read:.2f} ms weight read per GPU" if read else ""  # noqa: E731
  for name, label in (("tp4_tpot", f"tp{tp}"), ("fp8_tpot", "fp8 tp2")):
    r = _load(out, f"{name}.json")
    if r:
      ms = 1e3 / r["output_tokens_per_s"]
      rows.append(
        f"{label} single stream {r['input_len']}/{r['output_len']}: {ms:.2f} ms/token"
        + (beside(ms) if name == "tp4_tpot" else "")
      )
  for path in sorted(out.glob("steps_*.json")):
    result = json.loads(path.read_text())
    for row in result["rows"]:
      step, reduce = row["decode_ms_per_step"], row["all_reduce_ms_per_step"]
      rows.append(
        f"tp{row['tp']} decode batch {result['batch']} (context {result['context']}): "
        f"{step:.2f} ms/step{beside(step)}; all-reduces {reduce:.2f} ms "
        f"({reduce / step:.0%} of the step)"
      )
  for name, label in (("tp4_off", f"tp{tp}"), ("fp8_off", "fp8 tp2")):
    r = _load(out, f"{name}.json")
    if r:
      rows.append(
        f"{label} offline {r['num_prompts']} x {r['input_len']}/{r['output_len']}: "
        f"{r['output_tokens_per_s']:.0f} out tok/s, {r['device_ms_per_step']:.2f} device ms/step, "
        f"KV pool {r['kv_pool_tokens']} tokens"
      )
  return rows


def main(argv: list[str]) -> int:
  out = Path(argv[1] if len(argv) > 1 else "out")
  tp = int(argv[2]) if len(argv) > 2 else 4
  found = lines(out, tp)
  print("\n".join(found) if found else f"no results in {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
