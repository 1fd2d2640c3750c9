"""Subcommands `bench serve` and `bench throughput` for the `jaxserve` command.

`jaxserve.cli` calls `register(subparsers)`; each command imports its module only when it runs,
so `jaxserve --help` stays fast and torch / matplotlib are needed only by the commands using them.
Before it imports its module, a command checks the optional packages it will use
(jaxserve/optional_deps.py): a missing one is a one-line error naming the extra.

Files are written only when asked (`--save-result` / `--result-dir`, `--out`); nothing lands in
./out/ by default.
"""
from __future__ import annotations

import argparse
import math

from jaxserve.cli_args import add_engine_args
from jaxserve.optional_deps import HTTPX, MATPLOTLIB, TORCH, TRANSFORMERS, requiring


def register(subparsers) -> None:
  bench = subparsers.add_parser("bench", help="serving and offline throughput benchmarks",
                                description="Benchmarks: `bench serve` (against a running server) "
                                "and `bench throughput` (offline, optionally against transformers).")
  bench_commands = bench.add_subparsers(dest="bench_command", required=True)
  _add_bench_serve(bench_commands)
  _add_bench_throughput(bench_commands)


def _float_or_inf(text: str) -> float:
  return math.inf if text.strip().lower() == "inf" else float(text)


def _add_bench_serve(subparsers) -> None:
  parser = subparsers.add_parser(
      "serve", help="load-test an OpenAI-compatible /v1/completions server",
      description="Streams completions at Poisson/gamma arrival times and reports throughput "
      "and TTFT / TPOT / ITL / E2E latency (vLLM's definitions). Writes JSON and PNG plots.")
  parser.add_argument("--base-url", default="http://127.0.0.1:8000")
  parser.add_argument("--model", help="model name to request (default: the first in /v1/models)")
  parser.add_argument("--tokenizer", help="tokenizer for lengths and token-id prompts "
                      "(tiny-random or a checkpoint dir; default: --model if loadable)")
  parser.add_argument("--api-key")
  parser.add_argument("--endpoint", default="/v1/completions",
                      choices=["/v1/completions", "/v1/chat/completions"],
                      help="the route to load; chat sends each prompt as one user message")
  parser.add_argument("--dataset-name", "--dataset", dest="dataset", choices=["random", "sharegpt"],
                      default="random")
  parser.add_argument("--dataset-path", help="ShareGPT JSON file")
  parser.add_argument("--num-prompts", type=int, default=100)
  parser.add_argument("--random-input-len", type=int, default=128)
  parser.add_argument("--random-output-len", type=int, default=64)
  parser.add_argument("--random-range-ratio", type=float, default=0.0)
  parser.add_argument("--random-prompt-type", choices=["ids", "text"],
                      help="token-id prompts (needs a tokenizer) or random words (default: ids for "
                      "/v1/completions, text for chat)")
  parser.add_argument("--request-rate", type=_float_or_inf, default=math.inf,
                      help="requests per second (inf: all at once)")
  parser.add_argument("--burstiness", type=float, default=1.0,
                      help="gamma shape of the arrival gaps (1 = Poisson)")
  parser.add_argument("--max-concurrency", type=int)
  parser.add_argument("--ignore-eos", action="store_true")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--sweep-rates", help="comma-separated rates, e.g. 1,2,4,inf")
  parser.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                      help="comma-separated metrics whose percentiles are printed, of ttft, tpot, "
                      "itl, e2el")
  parser.add_argument("--metric-percentiles", default="99",
                      help="comma-separated percentiles to print and save, e.g. 25,50,99")
  parser.add_argument("--goodput", nargs="+", metavar="METRIC:MS",
                      help="service-level objectives, e.g. ttft:500 tpot:50 (ms; of ttft, tpot, "
                      "e2el): also report the rate of requests meeting all of them")
  parser.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
  parser.add_argument("--save-result", action="store_true",
                      help="write bench_serve.json and latency plots into --result-dir")
  parser.add_argument("--result-dir", "--out-dir", dest="result_dir",
                      help="where --save-result writes (giving it implies --save-result; "
                      "default: the current directory)")
  parser.set_defaults(func=requiring(_bench_serve, lambda args: [HTTPX, MATPLOTLIB]))


def _add_bench_throughput(subparsers) -> None:
  parser = subparsers.add_parser(
      "throughput", help="offline throughput through LLM.generate (optionally vs transformers)",
      description="Random token prompts, greedy, ignore_eos, all submitted at once; with "
      "--hf-baseline the same workload through transformers generate in static batches.")
  add_engine_args(parser, skip=("seed",))
  parser.add_argument("--num-prompts", type=int, default=256)
  parser.add_argument("--input-len", type=int, default=512)
  parser.add_argument("--output-len", type=int, default=128)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--hf-baseline", action="store_true",
                      help="also run transformers generate (needs torch + transformers)")
  parser.add_argument("--hf-batch-size", type=int, default=128)
  parser.add_argument("--hf-device", help="torch device for the baseline (default: cuda if "
                      "available, else cpu)")
  parser.add_argument("--random-model", choices=["llama-3.2-1b", "llama-3.1-8b"],
                      help="build a random-weight bfloat16 checkpoint of this shape and use it")
  parser.add_argument("--random-model-dir", help="where to write it (default: a temp dir)")
  parser.add_argument("--out", "--output-json", dest="out",
                      help="write the result JSON to this file (default: print only)")
  parser.set_defaults(func=requiring(
      _bench_throughput, lambda args: [TORCH, TRANSFORMERS] if args.hf_baseline else []))


# Each command imports its module when it runs.
def _bench_serve(args: argparse.Namespace) -> int:
  from jaxserve.bench import bench_serve
  return bench_serve.main(args)


def _bench_throughput(args: argparse.Namespace) -> int:
  from jaxserve.bench import bench_throughput
  return bench_throughput.main(args)
