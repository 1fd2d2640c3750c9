"""Renders benchmark JSON files (investigations/bench_kernels.py, jaxserve bench throughput,
jaxserve/bench/bench_offline.py) as the Markdown tables of docs/PERFORMANCE.md.

    python -m investigations.perf_tables docs/results/bench_kernels_h100.json
    # offline runs as columns
    python -m investigations.perf_tables --side-by-side sync.json async.json
"""

from __future__ import annotations

import json
import sys


def kernels(data: dict, label: str = "ours") -> str:
  lines = [
    f"Device: {data['device']}, JAX {data['jax']}, copy ceiling "
    f"{data['copy_gbps']:.0f} GB/s (read + write).",
    "",
    "| case | ours µs | ours KV GB/s | % of copy | bundled µs | XLA gather µs | "
    "ours / bundled | ours / XLA | max abs err (ours) |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for case in data["cases"]:
    t = case["time_us"]
    ours = t.get(label)
    if ours is None:
      continue
    bundled, xla = t.get("bundled"), t.get("xla")
    fmt = lambda v: "—" if v is None else f"{v:.1f}"
    ratio = lambda v, ours=ours: "—" if v is None else f"{v / ours:.2f}x"
    lines.append(
      f"| {case['name']} | {ours:.1f} | {case['kv_gbps'][label]:.0f} | "
      f"{case['pct_of_copy'][label]:.0f}% | {fmt(bundled)} | {fmt(xla)} | "
      f"{ratio(bundled)} | {ratio(xla)} | {case['max_abs_error'][label]:.1e} |"
    )
  return "\n".join(lines)


def throughput(data: dict) -> str:
  ours, hf = data["jaxserve"], data.get("transformers")
  lines = [
    "| engine | device | elapsed s | output tok/s | total tok/s |",
    "|---|---|---:|---:|---:|",
    f"| jaxserve | {ours['device']} | {ours['elapsed_s']:.2f} | "
    f"{ours['output_tokens_per_s']:.0f} | {ours['total_tokens_per_s']:.0f} |",
  ]
  if hf:
    lines.append(
      f"| transformers {hf['transformers']} generate (batch {hf['batch_size']}) | "
      f"{hf['device']} | {hf['elapsed_s']:.2f} | {hf['output_tokens_per_s']:.0f} | "
      f"{hf['total_tokens_per_s']:.0f} |"
    )
    lines += [
      "",
      f"jaxserve / transformers output throughput: **{data['speedup_vs_transformers']:.2f}x**",
    ]
  return "\n".join(lines)


def offline(data: dict) -> str:
  return offline_side_by_side([data])


def offline_side_by_side(runs: list[dict]) -> str:
  """jaxserve/bench/bench_offline.py results as one column per run."""
  heads = [
    ("async" if r.get("async_scheduling") else "sync") + " scheduling"
    if "async_scheduling" in r
    else "value"
    for r in runs
  ]
  lines = ["| metric | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(runs)]
  keys = (
    "output_tokens_per_s",
    "total_tokens_per_s",
    "steps_per_s",
    "host_ms_per_step",
    "wait_ms_per_step",
    "device_ms_per_step",
    "compilations_after_warmup",
  )
  fmt = lambda v: "—" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
  for key in keys:
    if any(key in r for r in runs):
      lines.append(f"| {key} | " + " | ".join(fmt(r.get(key)) for r in runs) + " |")
  phases = [name for r in runs for name in r.get("host_phase_ms_per_step", {})]
  for name in dict.fromkeys(phases):
    lines.append(
      f"| host {name} ms per step | "
      + " | ".join(fmt(r.get("host_phase_ms_per_step", {}).get(name)) for r in runs)
      + " |"
    )
  buckets = [name for r in runs for name in r.get("per_bucket", {})]
  for name in dict.fromkeys(buckets):
    cells = [r.get("per_bucket", {}).get(name) for r in runs]
    lines.append(
      f"| bucket {name}: steps / device ms per step | "
      + " | ".join(
        "—" if c is None else f"{c['steps']} / {c['device_ms_per_step']:.2f}" for c in cells
      )
      + " |"
    )
  return "\n".join(lines)


def main(paths: list[str]) -> int:
  if paths and paths[0] == "--side-by-side":  # several bench_offline.py results, one table
    print("<!-- " + " ".join(paths[1:]) + " -->")
    print(offline_side_by_side([json.load(open(p)) for p in paths[1:]]))
    return 0
  for path in paths:
    data = json.load(open(path))
    print(f"<!-- {path} -->")
    if "cases" in data:
      print(kernels(data))
    elif "jaxserve" in data:
      print(throughput(data))
    else:
      print(offline(data))
    print()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
