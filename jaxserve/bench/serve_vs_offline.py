"""The HTTP server against the engine in-process, on one machine in one run.

    python -m jaxserve.bench.serve_vs_offline --model /tmp/llama8b --config configs/h100.yaml \
        --max-model-len 2048 --out-dir out/serve_vs_offline

1. bench_offline (LLM.generate's in-process path, streaming each request's final output only)
   on N prompts of `--input-len` token ids, `--output-len` tokens each, greedy, ignore_eos,
   with the server's device-aware defaults (`--offline-defaults serve`: the same scheduler as
   the servers below, to compare the two paths alone) or LLM.generate's own (`offline`: each
   path with what it gets with no config); after the servers with `--offline-last` (the
   servers then start from this run's first, empty, compilation cache).
2. For each server mode (the multi-process server: an engine core process and
   `--api-server-count` API server processes; then the single-process server,
   `--api-server-count 0`: the engine core on a thread beside one API server): `jaxserve serve`
   with the same engine settings, then with `jaxserve bench serve`'s load generator (every
   token streamed, a chunk per step)
   a. the same N x in/out workload at an unbounded rate;
   b. a rate sweep (`--sweep-rates`, `--sweep-input-len` / `--sweep-output-len`,
      `--sweep-range-ratio`): rate x `--sweep-seconds` prompts per finite rate,
      `--sweep-inf-prompts` at inf;
   c. single-stream: `--single-stream-prompts` requests one at a time (TPOT of one sequence;
      0: none, and no weight-read time below).
   Each server's start records its step programs and the seconds from the warmup's start to
   the last one compiled (/metrics).
   During each run the CPU use of every server process (supervisor, core, api-K) is recorded
   (bench/process_cpu.py), to see how busy each one is.
3. The weight-read time: the checkpoint's weight bytes (a mixture of experts': those one decode
   token reads, bench/active_weights.py) over the device's measured copy bandwidth (a jitted
   copy of a 4 GiB array, read + write), the floor of a single stream's TPOT.
4. One JSON, the throughput-latency plot of both servers' sweeps, and a table on stdout
   (bench/serve_vs_offline_table.py; `--short-table`: one row per load, also written to
   short_table.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from jaxserve.bench.client_processes import machine_cores, plan_clients, run_clients
from jaxserve.bench.client_usage import small_gap_fraction
from jaxserve.bench.datasets import random_requests
from jaxserve.bench.flags import standalone_parser
from jaxserve.bench.latency_stats import format_table, summarize
from jaxserve.bench.process_cpu import CpuMeter
from jaxserve.bench.serve_client import ServeBenchConfig
from jaxserve.bench.serve_vs_offline_table import short_table, table
from jaxserve.bench.server_process import ServerProcess
from jaxserve.core.supervisor import default_api_server_count
from jaxserve.tools.json_file import write_json

MODES = {"multi-process": None, "single-process": 0}


def parse_args(argv=None) -> argparse.Namespace:
  parser = standalone_parser("serve_vs_offline", __doc__)
  parser.add_argument("--model", required=True)
  parser.add_argument("--config", help="YAML engine config for every run")
  parser.add_argument("--max-model-len", type=int, default=2048)
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument(
    "--api-server-count", type=int, help="of the multi-process server (default: jaxserve serve's)"
  )
  parser.add_argument("--num-prompts", type=int, default=1000)
  parser.add_argument("--input-len", type=int, default=256)
  parser.add_argument("--output-len", type=int, default=256)
  parser.add_argument("--sweep-rates", default="1,4,16,32,inf")
  parser.add_argument("--sweep-input-len", type=int, default=1024)
  parser.add_argument("--sweep-output-len", type=int, default=128)
  parser.add_argument("--sweep-range-ratio", type=float, default=0.5)
  parser.add_argument("--sweep-seconds", type=float, default=30.0)
  parser.add_argument("--sweep-inf-prompts", type=int, default=500)
  parser.add_argument("--single-stream-prompts", type=int, default=8)
  parser.add_argument(
    "--offline-defaults",
    choices=["serve", "offline"],
    default="serve",
    help="bench_offline's device-aware defaults: the servers' scheduler (serve) or "
    "LLM.generate's own (offline)",
  )
  parser.add_argument(
    "--offline-last", action="store_true", help="run bench_offline after the servers"
  )
  parser.add_argument(
    "--short-table", action="store_true", help="print (and write) the one-row-per-load table"
  )
  parser.add_argument(
    "--client-processes",
    type=int,
    default=None,
    help="load-generator processes (one asyncio client each; default: bench serve's plan, one "
    "per 128 streams open at once, at most half the cores)",
  )
  parser.add_argument(
    "--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES)
  )
  parser.add_argument("--port", type=int, default=8000)
  parser.add_argument("--start-timeout-s", type=float, default=900.0)
  parser.add_argument("--out-dir", default="out/serve_vs_offline")
  return parser.parse_args(argv)


def _engine_flags(args) -> list[str]:
  flags = ["--max-model-len", str(args.max_model_len)]
  if args.config:
    flags += ["--config", args.config]
  for item in args.set:
    flags += ["--set", item]
  return flags


def run_offline(args, out_dir: Path) -> dict:
  path = out_dir / "bench_offline.json"
  subprocess.run(
    [
      sys.executable,
      "-m",
      "jaxserve.bench.bench_offline",
      "--model",
      args.model,
      *_engine_flags(args),
      "--num-prompts",
      str(args.num_prompts),
      "--input-len",
      str(args.input_len),
      "--output-len",
      str(args.output_len),
      "--no-stream",
      "--defaults-for",
      args.offline_defaults,  # serve: the server's scheduler, the two runs differ by path alone
      "--log-level",
      "WARNING",
      "--out",
      str(path),
    ],
    check=True,
  )
  return json.loads(path.read_text())


_BANDWIDTH = """
import json, time, jax, jax.numpy as jnp
x = jnp.ones((1 << 31,), jnp.bfloat16)  # 4 GiB
copy = jax.jit(lambda a: a + jnp.bfloat16(1))
copy(x).block_until_ready()
start = time.perf_counter()
for _ in range(10):
  y = copy(x)
y.block_until_ready()
print(json.dumps({"copy_gb_per_s": 10 * 2 * x.nbytes / (time.perf_counter() - start) / 1e9}))
"""


def weight_read(model: str) -> dict:
  """The checkpoint's weight bytes and the device's copy bandwidth (a separate process, before
  any server holds the device); for a mixture of experts the read time is that of the weights
  one decode token reads (bench/active_weights.py), its routed experts only."""
  from jaxserve.bench.active_weights import active_weight_bytes
  from jaxserve.models.weights import load_hf_config

  files = list(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []
  if not files:
    return {}
  run = subprocess.run([sys.executable, "-c", _BANDWIDTH], capture_output=True, text=True)
  if run.returncode != 0:
    return {"error": run.stderr[-2000:]}
  result = json.loads(run.stdout.strip().splitlines()[-1])
  result["weight_bytes"] = sum(f.stat().st_size for f in files)
  config = load_hf_config(Path(model))
  read = active_weight_bytes(config) if config.num_experts else result["weight_bytes"]
  result["read_bytes"] = read
  result["weight_read_ms"] = read / (result["copy_gb_per_s"] * 1e9) * 1e3
  return result


def start_server(args, count: int, log_path: Path) -> tuple[ServerProcess, dict[str, float]]:
  """The server of one mode (`count` API server processes; 0: the single-process server),
  healthy once every bucket is compiled (`--warmup full`: the steady state; background
  compilation would pad the first steps) and every API server process serves; with the
  seconds from its start to both."""
  flags = [
    *_engine_flags(args),
    "--log-level",
    "WARNING",
    "--warmup",
    "full",
    "--api-server-count",
    str(count),
  ]
  server = ServerProcess(args.model, flags, log_path, port=args.port)
  try:
    started = {"health_s": server.wait_healthy(args.start_timeout_s)}
    started["all_api_servers_s"] = server.wait_api_servers(max(1, count), args.start_timeout_s)
    values = server.metrics()
    started["programs"] = values.get("jaxserve_step_programs_total", 0.0)
    started["programs_compile_s"] = values.get("jaxserve_step_programs_compile_seconds", 0.0)
  except RuntimeError:
    server.stop(timeout=10)
    raise
  return server, started


def vocabulary(model: str) -> tuple[str, list[int]]:
  from jaxserve.models.registry import load_model_tokenizer

  tokenizer = load_model_tokenizer(model)
  special = set(tokenizer.all_special_ids)
  return model, [i for i in range(tokenizer.backend.get_vocab_size()) if i not in special]


def run_load(
  url: str,
  name: str,
  requests,
  rate: float,
  concurrency: int | None = None,
  processes: int | None = 1,
  meter: CpuMeter | None = None,
) -> dict:
  """bench serve's load at `rate`, from `processes` client processes (None: bench serve's plan;
  client_processes.py: one arrival schedule dealt among them), so the client's own CPU does not
  cap what is measured; its CPU use is reported."""
  config = ServeBenchConfig(
    base_url=url,
    model=name,
    request_rate=rate,
    ignore_eos=True,
    max_concurrency=concurrency,
  )
  plan = plan_clients(processes, requests, rate, concurrency, machine_cores())
  if meter:
    meter.start()
  wall = time.monotonic()
  clients = run_clients(config, requests, plan)
  server_cpu = meter.stop(time.monotonic() - wall) if meter else {}
  records = clients.records
  metrics = summarize(records, clients.duration_s, (50.0, 99.0))
  print(format_table(metrics, f"Serving Benchmark Result (rate {rate})", ("ttft", "tpot", "itl")))
  errors = sorted({r.error for r in records if not r.success})
  return {
    "request_rate": "inf" if math.isinf(rate) else rate,
    "metrics": metrics.to_dict(),
    "client_processes": plan.processes,
    "errors": errors[:5],
    "client_cpu_per_process": max(u.cpu_share for u in clients.usages),
    "client_small_gap_fraction": small_gap_fraction(clients.usages),
    "client_usages": [u.to_dict() for u in clients.usages],
    "server_cpu": server_cpu,
  }


def bench_server(args, server: ServerProcess, count: int, pool: list[int]) -> dict:
  """The burst, the sweep and the single stream against a server of `count` API processes."""
  url, name = server.url, server.model
  burst = random_requests(args.num_prompts, args.input_len, args.output_len, seed=0, token_ids=pool)
  k = args.client_processes
  meter = CpuMeter(server.process.pid, count)
  result = {"sweep": [], "burst": run_load(url, name, burst, math.inf, processes=k, meter=meter)}
  for rate in [math.inf if r.strip() == "inf" else float(r) for r in args.sweep_rates.split(",")]:
    count = args.sweep_inf_prompts if math.isinf(rate) else max(4, round(rate * args.sweep_seconds))
    requests = random_requests(
      count,
      args.sweep_input_len,
      args.sweep_output_len,
      range_ratio=args.sweep_range_ratio,
      seed=1,
      token_ids=pool,
    )
    result["sweep"].append(run_load(url, name, requests, rate, processes=k, meter=meter))
  if args.single_stream_prompts < 1:
    return result
  single = random_requests(
    args.single_stream_prompts, args.sweep_input_len, args.sweep_output_len, seed=2, token_ids=pool
  )
  result["single_stream"] = run_load(url, name, single, math.inf, concurrency=1, meter=meter)
  return result


def main(argv=None) -> int:
  from jaxserve.tools import plots

  args = parse_args(argv)
  out_dir = Path(args.out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  result = {"model": args.model, "config": args.config, "args": vars(args), "servers": {}}
  if not args.offline_last:
    result["offline"] = run_offline(args, out_dir)
  result["weight_read"] = weight_read(args.model) if args.single_stream_prompts > 0 else {}
  name, pool = vocabulary(args.model)
  for mode in args.modes.split(","):
    count = MODES[mode] if mode != "multi-process" else args.api_server_count
    count = default_api_server_count() if count is None else count
    server, started = start_server(args, count, out_dir / f"serve_{mode}.log")
    try:
      result["servers"][mode] = {"started": started, **bench_server(args, server, count, pool)}
    finally:
      result["servers"].get(mode, {})["exit_code"] = server.stop()
    write_json(out_dir / "serve_vs_offline.json", result)  # what is done survives a cut run
  if args.offline_last:
    result["offline"] = run_offline(args, out_dir)
  write_json(out_dir / "serve_vs_offline.json", result)
  plots.sweep_curves(
    {mode: s["sweep"] for mode, s in result["servers"].items()},
    out_dir / "sweep_throughput_latency.png",
    title=f"{os.path.basename(args.model)}: {args.sweep_input_len} in / "
    f"{args.sweep_output_len} out, range ratio {args.sweep_range_ratio}",
  )
  if args.short_table:
    (out_dir / "short_table.md").write_text(short_table(result) + "\n")
    print(short_table(result))
  else:
    print(table(result))
  failed = sum(s["burst"]["metrics"]["failed"] for s in result["servers"].values())
  return 0 if failed == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
