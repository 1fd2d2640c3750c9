"""The `jaxserve bench` commands: serve, soak, throughput, offline, structured, prefix-cache,
startup, server-startup and batch-invariance (each described in docs/BENCHMARKS.md).

`jaxserve.cli`'s table takes BENCH (config/subcommands.py records, COMMANDS under it); the
flags come from flags.py, and each command imports its module only when it runs, so `jaxserve
--help` stays fast and torch / matplotlib are needed only by the commands using them. Before it
imports its module, a command checks the optional packages it will use
(jaxserve/runtime/optional_deps.py): a missing one is a one-line error naming the extra.

Files are written only when asked (`--save-result` / `--result-dir`, `--out`); nothing lands in
./out/ by default.
"""

from __future__ import annotations

import argparse

from jaxserve.bench import flags
from jaxserve.bench.soak_flags import add_soak_flags
from jaxserve.config.subcommands import Subcommand
from jaxserve.runtime.optional_deps import HTTPX, MATPLOTLIB, TORCH, TRANSFORMERS, requiring


# Each command imports its module when it runs.
def _bench_serve(args: argparse.Namespace) -> int:
  from jaxserve.bench import bench_serve

  return bench_serve.main(args)


def _bench_soak(args: argparse.Namespace) -> int:
  import logging

  from jaxserve.bench import soak

  logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per call otherwise
  return soak.main(args)


def _bench_throughput(args: argparse.Namespace) -> int:
  from jaxserve.bench import bench_throughput

  return bench_throughput.main(args)


def _bench_offline(args: argparse.Namespace) -> int:
  from jaxserve.bench import bench_offline

  return bench_offline.command(args)


def _bench_prefix_cache(args: argparse.Namespace) -> int:
  from jaxserve.bench import bench_prefix_cache

  return bench_prefix_cache.command(args)


def _bench_structured(args: argparse.Namespace) -> int:
  from jaxserve.bench import bench_structured

  return bench_structured.command(args)


def _bench_startup(args: argparse.Namespace) -> int:
  from jaxserve.bench import bench_startup

  return bench_startup.command(args)


def _bench_server_startup(args: argparse.Namespace) -> int:
  from jaxserve.bench import bench_server_startup

  return bench_server_startup.command(args)


def _bench_batch_invariance(args: argparse.Namespace) -> int:
  from jaxserve.bench import batch_invariance

  batch_invariance.command(args)
  return 0


COMMANDS: tuple[Subcommand, ...] = (
  Subcommand(
    "serve",
    help="load-test an OpenAI-compatible /v1/completions server",
    description="Streams completions at Poisson/gamma arrival times and reports throughput and "
    "TTFT / TPOT / ITL / E2E latency (vLLM's definitions). Writes JSON and PNG plots.",
    add_flags=flags.add_serve_flags,
    run=requiring(_bench_serve, lambda args: [HTTPX, MATPLOTLIB]),
  ),
  Subcommand(
    "soak",
    help="hold a running server past its capacity for minutes, with faults: which promises broke?",
    description="A mixed workload (completions and chat, streamed or not, n > 1, logprobs, stop "
    "strings, structured outputs, tool calls, long prompts) at --load times the measured "
    "capacity, with cancels, bad inputs, greedy canaries and killed API server processes; a row "
    "per window (throughput, TTFT / TPOT, statuses, KV pages, compilations, RSS, device memory) "
    "and the broken promises (exit status 1 if any).",
    add_flags=add_soak_flags,
    run=requiring(_bench_soak, lambda args: [HTTPX] + ([MATPLOTLIB] if args.plot else [])),
  ),
  Subcommand(
    "throughput",
    help="offline throughput through LLM.generate (optionally vs transformers)",
    description="Random token prompts, greedy, ignore_eos, all submitted at once; with "
    "--hf-baseline the same workload through transformers generate in static batches.",
    add_flags=flags.add_throughput_flags,
    run=requiring(
      _bench_throughput, lambda args: [TORCH, TRANSFORMERS] if args.hf_baseline else []
    ),
  ),
  Subcommand(
    "offline",
    help="the engine's own loop: tokens/s, host and device milliseconds per step",
    description="Random token prompts of fixed lengths (ignore_eos), all submitted at once to the "
    "engine in-process; reports output tokens/s, steps/s, host and device time per step and per "
    "bucket, and compilations after warmup (0 expected). Warmup is not timed.",
    add_flags=flags.add_offline_flags,
    run=_bench_offline,
  ),
  Subcommand(
    "structured",
    help="structured-output throughput: JSON-schema requests vs unconstrained",
    description="For each --concurrency C, C prompts unconstrained and then the same under a JSON "
    "schema, on one warmed engine: output tokens/s of both, their ratio, and the host time per "
    "step spent filling the grammar masks.",
    add_flags=flags.add_structured_flags,
    run=_bench_structured,
  ),
  Subcommand(
    "prefix-cache",
    help="prefix caching on against off: a shared system prompt at an arrival rate",
    description="Requests sharing a long system prompt arrive at --request-rate; the engine runs "
    "them with prefix caching on, then off (each in a fresh process): hit rate, prompt tokens "
    "computed, TTFT p50/p99 and output tokens/s side by side.",
    add_flags=flags.add_prefix_cache_flags,
    run=_bench_prefix_cache,
  ),
  Subcommand(
    "startup",
    help="start-up costs: weight loading (GB/s), the KV pool and warmup",
    description="Times loading the checkpoint's weights onto the devices, sizing the KV pool as "
    "the server does and (with --warmup full) compiling every bucket, in this process.",
    add_flags=flags.add_startup_flags,
    run=requiring(_bench_startup, lambda args: [TORCH] if args.build else []),
  ),
  Subcommand(
    "server-startup",
    help="`jaxserve serve` start-up: fresh, under load, and a warm restart",
    description="Starts `jaxserve serve` with an empty compilation cache and times /health, a "
    "first completion and the background compilation; runs a mixed workload (0 compilations "
    "expected); then restarts on the same cache and times it again.",
    add_flags=flags.add_server_startup_flags,
    run=requiring(_bench_server_startup, lambda args: [HTTPX]),
  ),
  Subcommand(
    "batch-invariance",
    help="does a greedy request give the same tokens alone and in a crowd?",
    description="Greedy probe requests alone, among other requests, preempted and on prefix-cache "
    "hits, compared bitwise (tokens and logprobs), with component checks that say which part of a "
    "step changes bits with the batch.",
    add_flags=flags.add_batch_invariance_flags,
    run=_bench_batch_invariance,
  ),
)

BENCH = Subcommand(
  "bench",
  help="benchmarks: serving, offline throughput, structured outputs, start-up, batch invariance",
  description="Benchmarks to run on your own deployment (docs/BENCHMARKS.md): `bench serve` "
  "against a running server, the others on an engine or server they start themselves.",
  commands=COMMANDS,
)
