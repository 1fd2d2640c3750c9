"""One serving configuration of scripts/gpu_dp.sh: `jaxserve serve MODEL FLAGS` (--warmup full),
then greedy requests whose tokens the table compares across configurations, then `jaxserve
bench serve`'s load (jaxserve/bench/serve_vs_offline.run_load) at each rate, then the requests
each engine core served in each load and in all (vLLM's per-core counters of /metrics). One
JSON in OUT/NAME.json.

    python scripts/gpu_dp_run.py --name dp2 --model /tmp/llama8b --out OUT \\
        -- --config configs/h100.yaml --data-parallel-size 2
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from jaxserve.bench.datasets import random_requests
from jaxserve.bench.serve_vs_offline import run_load, vocabulary
from jaxserve.bench.server_process import ServerProcess


def parse_args(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--name", required=True)
  parser.add_argument("--model", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--num-prompts", type=int, default=1000)
  parser.add_argument("--input-len", type=int, default=256)
  parser.add_argument("--output-len", type=int, default=256)
  parser.add_argument("--rates", default="inf,16", help="inf: --num-prompts at once")
  parser.add_argument("--rate-seconds", type=float, default=30.0, help="of each finite rate")
  parser.add_argument("--greedy-prompts", type=int, default=4)
  parser.add_argument("--greedy-tokens", type=int, default=64)
  parser.add_argument("--client-processes", type=int, default=4, help="of the load generator")
  parser.add_argument("--api-servers", type=int, default=1, help="to wait for before the load")
  parser.add_argument("--start-timeout-s", type=float, default=480.0)
  parser.add_argument("--log-level", default="WARNING", help="the server's")
  parser.add_argument("serve_flags", nargs=argparse.REMAINDER, help="after --: jaxserve serve's")
  args = parser.parse_args(argv)
  args.serve_flags = [f for f in args.serve_flags if f != "--"]
  return args


def greedy(server: ServerProcess, pool: list[int], args) -> list[dict]:
  """Greedy completions of fixed token-id prompts: their text and generated tokens."""
  prompts = random_requests(args.greedy_prompts, 128, args.greedy_tokens, seed=3, token_ids=pool)
  replies = []
  for request in prompts:
    body = {
      "model": server.model,
      "prompt": list(request.prompt),
      "max_tokens": args.greedy_tokens,
      "temperature": 0,
      "ignore_eos": True,
      "logprobs": 0,
    }
    choice = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300).json()
    choice = choice["choices"][0]
    replies.append({"text": choice["text"], "tokens": choice["logprobs"]["tokens"]})
  return replies


def served_by_core(url: str) -> dict[str, float]:
  """Requests each engine core finished (vllm:request_success_total by `engine`)."""
  text = httpx.get(f"{url}/metrics", timeout=10).text
  served: dict[str, float] = {}
  for family in text_string_to_metric_families(text):
    for sample in family.samples:
      if sample.name == "vllm:request_success_total":
        engine = sample.labels["engine"]
        served[engine] = served.get(engine, 0.0) + sample.value
  return served


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  flags = [*args.serve_flags, "--warmup", "full", "--log-level", args.log_level]
  server = ServerProcess(args.model, flags, out / f"{args.name}_serve.log")
  result: dict = {"name": args.name, "serve_flags": args.serve_flags, "runs": []}
  try:
    result["health_s"] = server.wait_healthy(args.start_timeout_s)
    server.wait_api_servers(args.api_servers, args.start_timeout_s)
    result["health"] = httpx.get(f"{server.url}/health").json()
    _, pool = vocabulary(args.model)
    result["greedy"] = greedy(server, pool, args)
    for rate in [math.inf if r == "inf" else float(r) for r in args.rates.split(",")]:
      count = args.num_prompts if math.isinf(rate) else max(4, round(rate * args.rate_seconds))
      requests = random_requests(count, args.input_len, args.output_len, seed=0, token_ids=pool)
      before, start = served_by_core(server.url), time.monotonic()
      run = run_load(server.url, server.model, requests, rate, processes=args.client_processes)
      run["wall_s"] = time.monotonic() - start
      after = served_by_core(server.url)
      run["served_by_core"] = {core: n - before.get(core, 0.0) for core, n in after.items()}
      result["runs"].append(run)
      (out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    result["served_by_core"] = served_by_core(server.url)
  finally:
    result["exit_code"] = server.stop()
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
