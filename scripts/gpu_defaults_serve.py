"""One server configuration of scripts/gpu_defaults_serve.sh (issue 29): `jaxserve serve MODEL
FLAGS` (--warmup full), then at rate inf (1000 x 256/256, every token streamed) `jaxserve bench
serve`'s load (serve_vs_offline.run_load, client processes chosen by bench serve), then
--rounds times the independent client (scripts/plain_client.py, --plain-processes processes)
and bench serve again, each round on new prompts (no prefix-cache hits); then bench serve at
--rate req/s for --rate-seconds (1024 in / 128 out, range ratio 0.5).
`--quick` leaves out the independent client and the second bench serve run (a setting's sweep:
one burst and the rate). One JSON in OUT/NAME.json; `--table OUT` prints the comparison of every
NAME.json there.

    python scripts/gpu_defaults_serve.py --name noconfig --model /tmp/llama8b --out OUT \\
        -- --max-model-len 2048
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from jaxserve.bench.datasets import random_requests
from jaxserve.bench.process_cpu import CpuMeter
from jaxserve.bench.serve_vs_offline import run_load, vocabulary
from jaxserve.bench.server_process import ServerProcess


def parse_args(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--name")
  parser.add_argument("--model")
  parser.add_argument("--out")
  parser.add_argument("--num-prompts", type=int, default=1000)
  parser.add_argument("--rate", type=float, default=16.0)
  parser.add_argument("--rate-seconds", type=float, default=30.0)
  parser.add_argument("--plain-processes", type=int, default=4)
  parser.add_argument(
    "--rounds", type=int, default=1, help="(plain client, bench serve) pairs after the first burst"
  )
  parser.add_argument("--api-servers", type=int, default=1, help="to wait for before the load")
  parser.add_argument("--table", help="print the table of the JSON files in this folder")
  parser.add_argument("--quick", action="store_true", help="one burst, no plain client")
  parser.add_argument("serve_flags", nargs=argparse.REMAINDER, help="after --: jaxserve serve's")
  args = parser.parse_args(argv)
  args.serve_flags = [f for f in args.serve_flags if f != "--"]
  return args


def plain(server: ServerProcess, args, out: Path, pool: list[int], round_: int = 0) -> dict:
  path = out / f"{args.name}_plain{'' if round_ == 0 else round_}.json"
  command = [sys.executable, str(Path(__file__).with_name("plain_client.py")), "--url", server.url]
  command += ["--model", server.model, "--num-prompts", str(args.num_prompts)]
  command += ["--processes", str(args.plain_processes), "--out", str(path)]
  command += ["--token-range", f"{pool[len(pool) // 10]},{pool[-1]}"]  # of the model's vocabulary
  command += ["--seed", str(11 + round_)]  # new prompts each round: no prefix-cache hits
  subprocess.run(command, check=False)
  return json.loads(path.read_text()) if path.exists() else {"error": "no result"}


GAP_HISTOGRAMS = ("jaxserve_inter_token_latency_seconds", "jaxserve_request_output_gap_seconds")


GC_PAUSES = "jaxserve_api_server_gc_pause_seconds"


def gap_counts(url: str) -> dict[str, list[float]]:
  """Each gap histogram's [observations under 1 ms, all observations] so far, and the API
  server processes' garbage collections [under 10 ms, all] (every generation)."""
  counts = {name: [0.0, 0.0] for name in (*GAP_HISTOGRAMS, GC_PAUSES)}
  for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
    for sample in family.samples:
      name = sample.name.removesuffix("_bucket")
      if name in counts and sample.name.endswith("_bucket"):
        below = "0.01" if name == GC_PAUSES else "0.001"
        if sample.labels.get("le") == below:
          counts[name][0] += sample.value
        elif sample.labels.get("le") == "+Inf":
          counts[name][1] += sample.value
  return counts


TCP_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPSynRetrans")


def tcp_counters() -> dict[str, int]:
  """This host's TcpExt counters of connections the listening sockets' queues refused (a
  refused SYN is sent again a second later) and of SYNs sent again; {} where Linux's
  /proc/net/netstat is absent."""
  try:
    lines = Path("/proc/net/netstat").read_text().splitlines()
  except OSError:
    return {}
  for names, values in zip(lines[::2], lines[1::2], strict=False):  # header, values line pairs
    if names.startswith("TcpExt:"):
      table = dict(zip(names.split()[1:], values.split()[1:], strict=True))
      return {name: int(table[name]) for name in TCP_COUNTERS if name in table}
  return {}


def with_server_gaps(url: str, load) -> dict:
  """run_load's result plus, per gap histogram, the share of its observations during the
  load under 1 ms (the engine's clock, then the API server handler's), and the host's TCP
  counters' growth during the load."""
  before, tcp = gap_counts(url), tcp_counters()
  result = load()
  after = gap_counts(url)
  result["tcp"] = {name: value - tcp[name] for name, value in tcp_counters().items() if name in tcp}
  result["server_small_gap_fraction"] = {
    name: (after[name][0] - before[name][0]) / max(1.0, after[name][1] - before[name][1])
    for name in GAP_HISTOGRAMS
  }
  collections = after[GC_PAUSES][1] - before[GC_PAUSES][1]
  result["api_gc_pauses"] = {
    "collections": collections,
    "10ms_or_more": collections - (after[GC_PAUSES][0] - before[GC_PAUSES][0]),
  }
  return result


LOAD_TIMEOUT_S = 300.0  # a load still running after this is stuck: stacks to the log, stop


class Watchdog:
  """Past LOAD_TIMEOUT_S of one load: every server process prints its stacks to the server's
  log, then the server is stopped (its streams end, so the load returns). `fired` says so."""

  def __init__(self, server: ServerProcess):
    self.server, self.fired = server, []

  def run(self, name: str, load):
    def stuck():
      self.fired.append(name)
      self.server.dump_stacks()
      time.sleep(2)
      self.server.process.terminate()

    timer = threading.Timer(LOAD_TIMEOUT_S, stuck)
    timer.start()
    try:
      return load()
    finally:
      timer.cancel()


def measure(args) -> int:
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  flags = [*args.serve_flags, "--warmup", "full", "--log-level", "INFO"]
  server = ServerProcess(args.model, flags, out / f"{args.name}_serve.log")
  result: dict = {"name": args.name, "serve_flags": args.serve_flags}
  try:
    result["health_s"] = server.wait_healthy(600)
    server.wait_api_servers(args.api_servers, 600)
    _, pool = vocabulary(args.model)
    burst = random_requests(args.num_prompts, 256, 256, seed=0, token_ids=pool)
    url, name = server.url, server.model
    meter = CpuMeter(server.process.pid, args.api_servers)  # each server process's CPU share
    watchdog = Watchdog(server)
    result["watchdog_fired"] = watchdog.fired
    result["bench_inf"] = [
      watchdog.run(
        "bench_inf",
        lambda: with_server_gaps(
          url, lambda: run_load(url, name, burst, math.inf, processes=None, meter=meter)
        ),
      )
    ]
    if not args.quick:
      result["plain_runs"] = []
      for round_ in range(args.rounds):
        result["plain_runs"].append(
          watchdog.run("plain_inf", lambda round_=round_: plain(server, args, out, pool, round_))
        )
        again = random_requests(args.num_prompts, 256, 256, seed=2 + round_, token_ids=pool)
        result["bench_inf"].append(
          watchdog.run(
            "bench_inf_again",
            lambda again=again: with_server_gaps(
              url, lambda: run_load(url, name, again, math.inf, processes=None, meter=meter)
            ),
          )
        )
      result["plain_inf"] = result["plain_runs"][0]
    count = max(4, round(args.rate * args.rate_seconds))
    steady = random_requests(count, 1024, 128, range_ratio=0.5, seed=1, token_ids=pool)
    result["bench_rate"] = watchdog.run(
      "bench_rate",
      lambda: with_server_gaps(url, lambda: run_load(url, name, steady, args.rate, processes=None)),
    )
  finally:
    result["exit_code"] = server.stop()
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
  return 0


def _p(run: dict, metric: str, q: str) -> float:
  return run["metrics"][metric]["percentiles_ms"][q]


def _server_cpu(run: dict) -> str:
  """Each server process's CPU share in the run (core, API servers), from CpuMeter."""
  shares = run.get("server_cpu") or {}
  return ", ".join(f"{role} {share:.2f}" for role, share in sorted(shares.items())) or "-"


def _gc(run: dict) -> str:
  pauses = run.get("api_gc_pauses")
  return f"{pauses['10ms_or_more']:.0f} / {pauses['collections']:.0f}" if pauses else "-"


def _ms(seconds: float | None) -> str:
  return "-" if seconds is None else f"{1e3 * seconds:.0f}"


def _tcp(run: dict) -> str:
  tcp = run.get("tcp") or {}
  return f"{tcp.get('ListenDrops', '-')} / {tcp.get('TCPSynRetrans', '-')}"


def _gaps(run: dict) -> str:
  server = run.get("server_small_gap_fraction", {})
  parts = [run["client_small_gap_fraction"], *(server.get(n) for n in reversed(GAP_HISTOGRAMS))]
  return " / ".join("-" if p is None else f"{p:.3f}" for p in parts)


def _itl(run: dict) -> str:
  """The burst's ITL p50 / p99 and TPOT p50 (ms)."""
  itl = run["metrics"]["itl"]
  return f"{itl['median_ms']:.1f} / {_p(run, 'itl', 'p99'):.1f}, {_p(run, 'tpot', 'p50'):.1f}"


def table(folder: Path) -> None:
  print(
    "| run | bench serve tok/s (in order) | plain client tok/s (between) | plain / bench medians | "
    "TTFT p99 @rate | TPOT p99 @rate | ITL p50 / p99, TPOT p50 (inf) | "
    "ITL p50 / TPOT p50 (peak streams, TTFT p50, latest send's lag) per client process (inf) | "
    "gaps < 1 ms: client / API handler / engine | client CPU | server CPU (inf) | "
    "API GC pauses >= 10 ms / all (inf) | TCP listen drops / SYNs sent again (inf) | failed |"
  )
  print("|---|---|---:|---:|---:|---:|---|---|---|---|---|---|---|---:|")
  for path in sorted(folder.glob("*.json")):
    data = json.loads(path.read_text())
    if "bench_inf" not in data:
      continue
    bench = [r["metrics"]["output_throughput"] for r in data["bench_inf"]]
    plains = [r.get("output_tokens_per_s", float("nan")) for r in data.get("plain_runs", [])]
    plains = plains or [data.get("plain_inf", {}).get("output_tokens_per_s", float("nan"))]
    first = data["bench_inf"][0]
    per = ", ".join(
      f"{1e3 * (u['itl_p50_s'] or 0):.1f}/{1e3 * (u['tpot_p50_s'] or 0):.1f}"
      f" ({u.get('peak_streams', '-')}, {_ms(u.get('ttft_p50_s'))}, {_ms(u.get('send_lag_max_s'))})"
      for u in first.get("client_usages", [])
    )
    cpu = "/".join(f"{u['cpu_share']:.2f}" for u in first.get("client_usages", []))
    rate = data.get("bench_rate")
    runs = [*data["bench_inf"], *([rate] if rate else [])]
    failed = sum(r["metrics"]["failed"] for r in runs)
    failed += sum(r.get("failed", 0) for r in data.get("plain_runs", [data.get("plain_inf", {})]))
    ttft = f"{_p(rate, 'ttft', 'p99'):.0f}" if rate else "-"
    tpot = f"{_p(rate, 'tpot', 'p99'):.1f}" if rate else "-"
    print(
      f"| {data['name']} | {' / '.join(f'{b:,.0f}' for b in bench)} | "
      f"{' / '.join(f'{p:,.0f}' for p in plains)} | "
      f"{statistics.median(plains) / statistics.median(bench):.3f} | {ttft} | {tpot} | "
      f"{_itl(first)} | {per} | "
      f"{_gaps(first)} | {cpu} | {_server_cpu(first)} | {_gc(first)} | {_tcp(first)} | {failed} |"
    )


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.table:
    table(Path(args.table))
    return 0
  return measure(args)


if __name__ == "__main__":
  sys.exit(main())
