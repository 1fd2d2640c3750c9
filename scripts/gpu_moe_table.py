"""The short table of scripts/gpu_moe.sh: one line per result its steps left in OUT (a missing
result is left out).

    python scripts/gpu_moe_table.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(out: Path, name: str) -> dict | None:
  path = out / name
  return json.loads(path.read_text()) if path.is_file() else None


def _latency(metrics: dict) -> str:
  cells = []
  for key in ("ttft", "tpot", "itl"):
    d = metrics[key]
    cells.append(f"{key.upper()} {d['median_ms']:.1f}/{d['percentiles_ms']['p99']:.1f}")
  return ", ".join(cells) + " ms p50/p99"


# a two-device run -> the one-device run whose tokens it is compared with: the default numerics'
# or, with tp_invariant_reductions, the one-device run cut as that layout cuts the experts
REFERENCE = {"tp2": "one", "ep2": "one", "tp2_inv": "one_inv_tp", "ep2_inv": "one_inv_ep"}


def _same_tokens(run: dict, reference: dict | None) -> str:
  """How many of `run`'s requests produced the one-device run's tokens (same prompts)."""
  if not reference or run["num_prompts"] != reference["num_prompts"]:
    return ""
  # a run without digests pairs none
  pairs = zip(run.get("token_digests", []), reference.get("token_digests", []), strict=False)
  same = sum(a == b for a, b in pairs)
  return f", tokens as on one device: {same}/{run['num_prompts']} requests"


def single_stream_line(out: Path, prefix: str, label: str) -> list[str]:
  """`prefix`_tpot.json's time per token beside the read time of `prefix`_active.json's bytes."""
  tpot, active, copy = (
    _load(out, n) for n in (f"{prefix}_tpot.json", f"{prefix}_active.json", "copy_bandwidth.json")
  )
  if not tpot:
    return []
  ms = 1e3 / tpot["output_tokens_per_s"]
  line = f"{label} single stream {tpot['input_len']}/{tpot['output_len']}: {ms:.2f} ms/token"
  if active and copy:
    read_ms = active["active_weight_bytes"] / (copy["copy_gb_per_s"] * 1e9) * 1e3
    line += (
      f" vs {read_ms:.2f} ms to read the {active['active_weight_bytes'] / 1e9:.2f} GB one token"
      f" reads at {copy['copy_gb_per_s']:.0f} GB/s ({ms / read_ms:.2f}x)"
    )
  return [line]


def moe_lines(out: Path) -> list[str]:
  lines = single_stream_line(out, "moe", "qwen3-30b-a3b")
  no_config = sorted(p.name[4:-5] for p in out.glob("moe_nc_*.json"))  # the qoff steps
  for label in (
    "off",
    "one",
    "tp2",
    "ep2",
    "one_inv_tp",
    "one_inv_ep",
    "tp2_inv",
    "ep2_inv",
    *no_config,
  ):
    r = _load(out, f"moe_{label}.json")
    if r:
      reference = _load(out, f"moe_{REFERENCE[label]}.json") if label in REFERENCE else None
      lines.append(
        f"qwen3-30b-a3b {label} {r['num_prompts']} x {r['input_len']}/{r['output_len']}: "
        f"{r['output_tokens_per_s']:.0f} out tok/s, {r['device_ms_per_step']:.2f} device ms/step, "
        f"KV pool {r['kv_pool_tokens']} tokens" + _same_tokens(r, reference)
      )
  serve = _load(out, "moe_serve/serve_vs_offline.json")
  for mode, server in (serve or {}).get("servers", {}).items():
    burst = server["burst"]["metrics"]
    lines.append(f"qwen3-30b-a3b {mode} HTTP burst: {burst['output_throughput']:.0f} out tok/s")
    for run in server["sweep"] + [dict(server["single_stream"], request_rate="1 stream")]:
      m = run["metrics"]
      lines.append(
        f"  rate {run['request_rate']}: {m['output_throughput']:.0f} out tok/s, {_latency(m)}"
      )
  return lines


GMM_KINDS = (
  "ragged_dot",
  "pallas",
  "expert_ffn",
  "expert_ffn_ragged",
  "dense_all",
  "per_token_gather",
)


def gmm_lines(out: Path) -> list[str]:
  gmm = _load(out, "gmm.json")
  if not gmm:
    return []
  lines = [f"grouped matmul ({gmm['device']}, {gmm['shape']}): weight GB/s of touched experts"]
  for row in gmm["rows"]:
    cells = ", ".join(
      f"{kind} error"
      if "error" in row[kind]
      else f"{kind} {row[kind]['us']:.0f} us {row[kind]['gb_per_s']:.0f} GB/s"
      for kind in GMM_KINDS
      if kind in row
    )
    lines.append(
      f"  batch {row['tokens']} ({row['experts_touched']:.0f} experts): {cells}; "
      f"copy {row['copy_gb_per_s']:.0f} GB/s"
    )
  return lines


def gemma_lines(out: Path) -> list[str]:
  lines = single_stream_line(out, "gemma", "gemma-3-12b")
  for length in ("1k", "8k"):
    runs = {win: _load(out, f"gemma_{length}_{win}.json") for win in ("on", "off")}
    for win, r in runs.items():
      if r:
        lines.append(
          f"gemma-3-12b {r['num_prompts']} x {r['input_len']}/{r['output_len']} windows {win}: "
          f"{r['output_tokens_per_s']:.0f} out tok/s, KV pool {r['kv_pool_tokens']} tokens"
          f" ({r.get('kv_pool_tokens_windowed', r['kv_pool_tokens'])} with window freeing)"
        )
    if runs["on"] and runs["off"]:
      speedup = runs["on"]["output_tokens_per_s"] / runs["off"]["output_tokens_per_s"]
      lines.append(f"  windows on / off: {speedup:.2f}x")
  return lines


def main(argv: list[str]) -> int:
  out = Path(argv[1] if len(argv) > 1 else "out")
  lines = moe_lines(out) + gmm_lines(out) + gemma_lines(out)
  print("\n".join(lines) if lines else f"no results in {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
