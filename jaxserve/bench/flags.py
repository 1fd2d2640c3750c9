"""The flags of each `jaxserve bench` command, one function per command.

cli.py builds the `jaxserve bench <name>` subcommands from these functions, and each benchmark
that also runs as `python -m jaxserve.bench.<module>` builds that parser from the same function
(`standalone_parser`), so both entry points take the same flags with the same defaults and show
the defaults in --help. Both write files only when asked (`--out` unset: print only). Nothing here
imports jax or a benchmark module, so `jaxserve --help` stays fast.
"""

from __future__ import annotations

import argparse
import math

from jaxserve.config.cli_args import add_engine_args
from jaxserve.config.cli_help import DefaultsHelpFormatter

DEFAULT_TPOT_PROBES = "1x128/128,4x512/64"  # bench/tpot_probe.py: COUNTxPROMPT/OUTPUT,...

INVARIANCE_SCENARIOS = ("alone", "crowd", "preempt", "prefix")


def standalone_parser(module: str, doc: str) -> argparse.ArgumentParser:
  """The parser of `python -m jaxserve.bench.<module>`, described by its docstring's first line."""
  return argparse.ArgumentParser(
    prog=f"python -m jaxserve.bench.{module}",
    description=doc.split("\n")[0],
    formatter_class=DefaultsHelpFormatter,
  )


def _add_out(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
    "--out", default=None, help="write the result JSON to this file (default: print only)"
  )


def float_or_inf(text: str) -> float:
  return math.inf if text.strip().lower() == "inf" else float(text)


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
  """`bench serve`: the load generator against a running server (bench_serve.py)."""
  parser.add_argument("--base-url", default="http://127.0.0.1:8000")
  parser.add_argument("--model", help="model name to request (default: the first in /v1/models)")
  parser.add_argument(
    "--tokenizer",
    help="tokenizer for lengths and token-id prompts "
    "(tiny-random or a checkpoint dir; default: --model if loadable)",
  )
  parser.add_argument("--api-key")
  parser.add_argument(
    "--endpoint",
    default="/v1/completions",
    choices=["/v1/completions", "/v1/chat/completions"],
    help="the route to load; chat sends each prompt as one user message",
  )
  parser.add_argument(
    "--dataset-name", "--dataset", dest="dataset", choices=["random", "sharegpt"], default="random"
  )
  parser.add_argument("--dataset-path", help="ShareGPT JSON file")
  parser.add_argument("--num-prompts", type=int, default=100)
  parser.add_argument("--random-input-len", type=int, default=128)
  parser.add_argument("--random-output-len", type=int, default=64)
  parser.add_argument("--random-range-ratio", type=float, default=0.0)
  parser.add_argument(
    "--random-prompt-type",
    choices=["ids", "text"],
    help="token-id prompts (needs a tokenizer) or random words (default: ids for "
    "/v1/completions, text for chat)",
  )
  parser.add_argument(
    "--request-rate",
    type=float_or_inf,
    default=math.inf,
    help="requests per second (inf: all at once)",
  )
  parser.add_argument(
    "--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps (1 = Poisson)"
  )
  parser.add_argument("--max-concurrency", type=int)
  parser.add_argument(
    "--client-processes",
    type=int,
    help="client processes the load is spread over (default: as many as the streams open at "
    "once and the chunk rate need, at most half of this machine's cores; the report says how "
    "many ran and why)",
  )
  parser.add_argument("--ignore-eos", action="store_true")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--sweep-rates", help="comma-separated rates, e.g. 1,2,4,inf")
  parser.add_argument(
    "--percentile-metrics",
    default="ttft,tpot,itl",
    help="comma-separated metrics whose percentiles are printed, of ttft, tpot, itl, e2el",
  )
  parser.add_argument(
    "--metric-percentiles",
    default="99",
    help="comma-separated percentiles to print and save, e.g. 25,50,99",
  )
  parser.add_argument(
    "--goodput",
    nargs="+",
    metavar="METRIC:MS",
    help="service-level objectives, e.g. ttft:500 tpot:50 (ms; of ttft, tpot, "
    "e2el): also report the rate of requests meeting all of them",
  )
  parser.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
  parser.add_argument(
    "--save-result",
    action="store_true",
    help="write bench_serve.json and latency plots into --result-dir",
  )
  parser.add_argument(
    "--result-dir",
    "--out-dir",
    dest="result_dir",
    help="where --save-result writes (giving it implies --save-result; "
    "default: the current directory)",
  )


def add_throughput_flags(parser: argparse.ArgumentParser) -> None:
  """`bench throughput`: LLM.generate, optionally against transformers (bench_throughput.py)."""
  add_engine_args(parser, skip=("seed",))
  parser.add_argument("--num-prompts", type=int, default=256)
  parser.add_argument("--input-len", type=int, default=512)
  parser.add_argument("--output-len", type=int, default=128)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--hf-baseline",
    action="store_true",
    help="also run transformers generate (needs torch + transformers)",
  )
  parser.add_argument("--hf-batch-size", type=int, default=128)
  parser.add_argument(
    "--hf-device", help="torch device for the baseline (default: cuda if available, else cpu)"
  )
  parser.add_argument(
    "--random-model",
    choices=["llama-3.2-1b", "llama-3.1-8b"],
    help="build a random-weight bfloat16 checkpoint of this shape and use it",
  )
  parser.add_argument("--random-model-dir", help="where to write it (default: a temp dir)")
  parser.add_argument(
    "--out",
    "--output-json",
    dest="out",
    help="write the result JSON to this file (default: print only)",
  )


def add_offline_flags(parser: argparse.ArgumentParser) -> None:
  """`bench offline`: the engine's own loop, host and device time per step (bench_offline.py)."""
  add_engine_args(parser, skip=("seed",))  # --seed here seeds the prompts
  parser.add_argument("--num-prompts", type=int, default=64)
  parser.add_argument("--input-len", type=int, default=128)
  parser.add_argument("--output-len", type=int, default=64)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--no-stream",
    action="store_true",
    help="report each request once finished (as LLM.generate does) instead of "
    "streaming every step's tokens",
  )
  parser.add_argument(
    "--defaults-for",
    choices=["offline", "serve"],
    default="offline",
    help="the device-aware choices for the settings not given: LLM.generate's (offline) or "
    "`jaxserve serve`'s (serve: a server's scheduler, to compare the two paths alone)",
  )
  parser.add_argument(
    "--profile-host",
    metavar="PATH",
    help="run the timed loop under cProfile and write the 40 functions with "
    "the most own time to PATH (slows the host; for where, not how fast)",
  )
  _add_out(parser)


def add_prefix_cache_flags(parser: argparse.ArgumentParser) -> None:
  """`bench prefix-cache`: a shared system prompt, caching on against off
  (bench_prefix_cache.py)."""
  add_engine_args(parser, skip=("seed",))  # --seed here seeds the prompts and arrivals
  parser.add_argument("--prefix-len", type=int, default=256, help="shared system prompt tokens")
  parser.add_argument("--suffix-len", type=int, default=16, help="each request's own tokens")
  parser.add_argument("--num-prompts", type=int, default=32)
  parser.add_argument("--output-len", type=int, default=16)
  parser.add_argument(
    "--request-rate",
    type=float_or_inf,
    default=math.inf,
    help="Poisson arrivals per second (inf: all at once)",
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--caching",
    choices=["both", "on", "off"],
    default="both",
    help="both: on, then off, each in a fresh process, compared",
  )
  _add_out(parser)


def add_structured_flags(parser: argparse.ArgumentParser) -> None:
  """`bench structured`: JSON-schema requests against unconstrained ones (bench_structured.py)."""
  add_engine_args(parser, skip=("seed",))
  parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 8])
  parser.add_argument("--input-len", type=int, default=32)
  parser.add_argument(
    "--output-len",
    type=int,
    default=256,
    help="max_tokens of a constrained request (room for a whole document of the schema)",
  )
  parser.add_argument(
    "--synthetic-bpe-vocab",
    type=int,
    default=0,
    help="serve with a synthetic byte-level BPE of this many pieces instead of "
    "the checkpoint's tokenizer (0: the checkpoint's)",
  )
  parser.add_argument("--seed", type=int, default=0)
  _add_out(parser)


def add_startup_flags(parser: argparse.ArgumentParser) -> None:
  """`bench startup`: weight loading, the KV pool and warmup, in-process (bench_startup.py)."""
  add_engine_args(parser)
  parser.add_argument(
    "--build",
    metavar="SHAPE",
    help="write a random checkpoint of this shape (llama-3.2-1b, llama-3.1-8b) "
    "into --model first, if it holds none",
  )
  parser.add_argument("--load-runs", type=int, default=2, help="timed weight loads (default 2)")
  parser.add_argument("--cold", action="store_true", help="do not pre-read the checkpoint files")
  parser.add_argument(
    "--baseline",
    action="store_true",
    help="also time the host-converted path (transpose and cast on the host, "
    "one synchronous device_put per tensor: the loader before issue 16)",
  )
  _add_out(parser)


def add_server_startup_flags(parser: argparse.ArgumentParser) -> None:
  """`bench server-startup`: `jaxserve serve` fresh, under load and restarted
  (bench_server_startup.py). The engine flags are passed to the server, not applied here."""
  parser.add_argument("--model", required=True)
  parser.add_argument("--config", default=None)
  parser.add_argument("--max-model-len", type=int, default=2048)
  parser.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="a config override for the server (repeatable; default: none)",
  )
  parser.add_argument(
    "--cache-dir", default=None, help="compilation cache (default: a new empty temporary directory)"
  )
  parser.add_argument("--workload-s", type=float, default=150.0)
  parser.add_argument("--concurrency", type=int, default=64)
  parser.add_argument("--max-prompt", type=int, default=1500)
  parser.add_argument("--max-output", type=int, default=256)
  parser.add_argument("--compile-timeout-s", type=float, default=420.0)
  parser.add_argument(
    "--restart-wait", action="store_true", help="also time the restart's background compilation"
  )
  parser.add_argument(
    "--tpot-probes",
    nargs="?",
    const=DEFAULT_TPOT_PROBES,
    default=None,
    metavar="COUNTxPROMPT/OUTPUT,...",
    help="time streams right after /health and again once every program is compiled "
    f"(bench/tpot_probe.py; the flag alone: {DEFAULT_TPOT_PROBES})",
  )
  parser.add_argument(
    "--out",
    default=None,
    help="write the result JSON to this file, and the servers' logs beside it "
    "(default: print only, the logs in a temporary directory)",
  )


def add_batch_invariance_flags(parser: argparse.ArgumentParser) -> None:
  """`bench batch-invariance`: a greedy request alone and in a crowd, bitwise
  (batch_invariance.py)."""
  parser.add_argument("--model", default="tiny-random")
  parser.add_argument("--config", default=None, help="a YAML config (e.g. configs/h100.yaml)")
  parser.add_argument(
    "--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides, as the CLI's"
  )
  parser.add_argument(
    "--batch-invariant",
    choices=("on", "off", "config"),
    default="config",
    help="EngineConfig.batch_invariant (config: leave it as configured)",
  )
  parser.add_argument("--num-probes", type=int, default=8)
  parser.add_argument("--num-tokens", type=int, default=128)
  parser.add_argument("--num-others", type=int, default=200)
  parser.add_argument("--min-len", type=int, default=20)
  parser.add_argument("--max-len", type=int, default=300)
  parser.add_argument(
    "--scenarios",
    default=",".join(INVARIANCE_SCENARIOS),
    help="comma-separated, of " + ", ".join(INVARIANCE_SCENARIOS),
  )
  parser.add_argument(
    "--components",
    choices=("on", "off", "untimed", "configured"),
    default="on",
    help="also run the component checks (bench/invariance_components.py); "
    "untimed: without the GEMM timings; configured: untimed, and of the GEMM formulations the "
    "configured step's alone",
  )
  parser.add_argument("--seed", type=int, default=0)
  _add_out(parser)
