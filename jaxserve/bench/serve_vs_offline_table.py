"""serve_vs_offline's table: a result JSON (bench/serve_vs_offline.py) as text. Per server mode,
the burst's output tok/s against LLM.generate's, TPOT and ITL p50 / p99, the client's and the
server processes' CPU and the start-up times; then each sweep rate's TTFT / TPOT / ITL and the
single stream's TPOT against the weight-read time."""

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
    for run in server["sweep"] + [dict(server["single_stream"], request_rate="1 stream")]:
      m = run["metrics"]
      lines.append(
        f"{mode:<34}{str(run['request_rate']):>6}{m['output_throughput']:>11.0f}"
        f"{_pair(m, 'ttft'):>20}{_pair(m, 'tpot'):>18}{_pair(m, 'itl'):>18}"
      )
  read = result["weight_read"].get("weight_read_ms")
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


def _pair(metrics: dict, key: str) -> str:
  d = metrics[key]
  return f"{d['median_ms']:.1f} / {d['percentiles_ms']['p99']:.1f}"
