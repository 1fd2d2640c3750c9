"""serve_vs_offline's tables: a result JSON (bench/serve_vs_offline.py) as text.

`table`: per server mode, the burst's output tok/s against LLM.generate's, TPOT and ITL p50 /
p99, the client's and the server processes' CPU and the start-up times; then each sweep rate's
TTFT / TPOT / ITL and the single stream's TPOT against the weight-read time.
`short_table`: one markdown row per load (LLM.generate's burst, then each server's burst and
sweep rates): output tok/s, the ratio to LLM.generate's, TTFT and TPOT p50 / p99, each client
process's CPU share and the failed requests; then each server's step programs and start."""

from __future__ import annotations


def table(result: dict) -> str:
  a = result["args"]
  sweep = f"sweep ({a['sweep_input_len']}/{a['sweep_output_len']}, ratio {a['sweep_range_ratio']})"
  offline = result["offline"]["output_tokens_per_s"]
  lines = [
    f"{'path':<34}{'out tok/s':>11}{'vs offline':>11}{'failed':>8}"
    f"{'TPOT p50/p99 ms':>18}{'ITL p50/p99 ms':>18}",
    f"{'LLM.generate (bench_offline)':<34}{offline:>11.0f}{'100%':>11}",
  ]
  for mode, server in result["servers"].items():
    m = server["burst"]["metrics"]
    lines.append(
      f"{mode + ' HTTP, burst':<34}{m['output_throughput']:>11.0f}"
      f"{m['output_throughput'] / offline:>11.0%}{m['failed']:>8}"
      f"{_pair(m, 'tpot'):>18}{_pair(m, 'itl'):>18}"
      f"  (client CPU {server['burst']['client_cpu_per_process']:.0%} per process)"
    )
    if server["burst"].get("server_cpu"):
      lines.append(
        f"{mode} server CPU in the burst (cores): "
        + ", ".join(f"{role} {cores:.2f}" for role, cores in server["burst"]["server_cpu"].items())
      )
    if server.get("started"):
      lines.append(
        f"{mode} server: /health 200 at {server['started']['health_s']:.1f} s, every "
        f"API server process at {server['started']['all_api_servers_s']:.1f} s"
      )
  lines.append("")
  lines.append(
    f"{sweep:<34}{'rate':>6}{'out tok/s':>11}"
    f"{'TTFT p50/p99 ms':>20}{'TPOT p50/p99 ms':>18}{'ITL p50/p99 ms':>18}"
  )
  for mode, server in result["servers"].items():
    stream = server.get("single_stream")
    single = [dict(stream, request_rate="1 stream")] if stream else []
    for run in server["sweep"] + single:
      m = run["metrics"]
      lines.append(
        f"{mode:<34}{str(run['request_rate']):>6}{m['output_throughput']:>11.0f}"
        f"{_pair(m, 'ttft'):>20}{_pair(m, 'tpot'):>18}{_pair(m, 'itl'):>18}"
      )
  read = result.get("weight_read", {}).get("weight_read_ms")
  if read:
    lines.append("")
    lines.append(
      f"weight-read time {read:.2f} ms ({result['weight_read']['read_bytes'] / 1e9:.1f}"
      f" GB at {result['weight_read']['copy_gb_per_s']:.0f} GB/s copy bandwidth); "
      "single-stream TPOT p50 / weight-read: "
      + ", ".join(
        f"{mode} {s['single_stream']['metrics']['tpot']['median_ms'] / read:.2f}x"
        for mode, s in result["servers"].items()
      )
    )
  return "\n".join(lines)


def short_table(result: dict) -> str:
  """The one-row-per-load table (module docstring)."""
  offline = result["offline"]
  base = offline["output_tokens_per_s"]
  a = result["args"]
  lines = [
    "| run | output tok/s | / LLM.generate | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
    "| client CPU per process | failed |",
    "|---|---:|---:|---:|---:|---|---:|",
    f"| LLM.generate ({offline.get('defaults_for', 'serve')} defaults), "
    f"{a['num_prompts']} x {a['input_len']}/{a['output_len']} | {base:,.0f} | 1.000 | | | | |",
  ]
  for mode, server in result["servers"].items():
    runs = [("burst", server["burst"])] + [
      (
        f"rate {run['request_rate']} ({a['sweep_input_len']}/{a['sweep_output_len']}, range "
        f"{a['sweep_range_ratio']})",
        run,
      )
      for run in server["sweep"]
    ]
    for what, run in runs:
      m = run["metrics"]
      ratio = f"{m['output_throughput'] / base:.3f}" if what == "burst" else ""
      cpu = "/".join(f"{u['cpu_share']:.2f}" for u in run.get("client_usages", []))
      lines.append(
        f"| {mode} HTTP, {what}, {run['client_processes']} client processes "
        f"| {m['output_throughput']:,.0f} | {ratio} | {_pair(m, 'ttft')} | {_pair(m, 'tpot')} "
        f"| {cpu} | {m['failed']} |"
      )
  for mode, server in result["servers"].items():
    started = server.get("started", {})
    if "programs" in started:
      lines.append(
        f"\n{mode} server: {started['programs']:.0f} step programs, the last compiled "
        f"{started['programs_compile_s']:.1f} s after the warmup's start; /health at "
        f"{started['health_s']:.1f} s"
      )
  return "\n".join(lines)


def _pair(metrics: dict, key: str) -> str:
  d = metrics[key]
  return f"{d['median_ms']:.1f} / {d['percentiles_ms']['p99']:.1f}"
