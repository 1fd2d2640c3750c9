"""The `jaxserve bench` commands: serve, soak, throughput, offline, structured, prefix-cache,
startup, server-startup and batch-invariance (each described in docs/BENCHMARKS.md).

`jaxserve.cli` calls `register(subparsers)`; the flags come from flags.py, and each command
imports its module only when it runs, so `jaxserve --help` stays fast and torch / matplotlib are
needed only by the commands using them. Before it imports its module, a command checks the
optional packages it will use (jaxserve/optional_deps.py): a missing one is a one-line error
naming the extra.

Files are written only when asked (`--save-result` / `--result-dir`, `--out`); nothing lands in
./out/ by default.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from jaxserve.bench import flags
from jaxserve.bench.soak_flags import add_soak_flags
from jaxserve.optional_deps import HTTPX, MATPLOTLIB, TORCH, TRANSFORMERS, requiring

Command = Callable[[argparse.Namespace], int]


def register(subparsers) -> None:
  bench = subparsers.add_parser(
    "bench",
    help="benchmarks: serving, offline throughput, structured outputs, start-up, batch invariance",
    description="Benchmarks to run on your own deployment (docs/BENCHMARKS.md): `bench serve` "
    "against a running server, the others on an engine or server they start themselves.",
  )
  commands = bench.add_subparsers(dest="bench_command", required=True)
  for name, summary, description, add_flags, command in COMMANDS:
    parser = commands.add_parser(name, help=summary, description=description)
    add_flags(parser)
    parser.set_defaults(func=command)


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


# name, --help line, description, flags, command
COMMANDS: tuple[tuple[str, str, str, Callable[[argparse.ArgumentParser], None], Command], ...] = (
  (
    "serve",
    "load-test an OpenAI-compatible /v1/completions server",
    "Streams completions at Poisson/gamma arrival times and reports throughput and TTFT / TPOT "
    "/ ITL / E2E latency (vLLM's definitions). Writes JSON and PNG plots.",
    flags.add_serve_flags,
    requiring(_bench_serve, lambda args: [HTTPX, MATPLOTLIB]),
  ),
  (
    "soak",
    "hold a running server past its capacity for minutes, with faults: which promises broke?",
    "A mixed workload (completions and chat, streamed or not, n > 1, logprobs, stop strings, "
    "structured outputs, tool calls, long prompts) at --load times the measured capacity, with "
    "cancels, bad inputs, greedy canaries and killed API server processes; a row per window "
    "(throughput, TTFT / TPOT, statuses, KV pages, compilations, RSS, device memory) and the "
    "broken promises (exit status 1 if any).",
    add_soak_flags,
    requiring(_bench_soak, lambda args: [HTTPX] + ([MATPLOTLIB] if args.plot else [])),
  ),
  (
    "throughput",
    "offline throughput through LLM.generate (optionally vs transformers)",
    "Random token prompts, greedy, ignore_eos, all submitted at once; with --hf-baseline the "
    "same workload through transformers generate in static batches.",
    flags.add_throughput_flags,
    requiring(_bench_throughput, lambda args: [TORCH, TRANSFORMERS] if args.hf_baseline else []),
  ),
  (
    "offline",
    "the engine's own loop: tokens/s, host and device milliseconds per step",
    "Random token prompts of fixed lengths (ignore_eos), all submitted at once to the engine "
    "in-process; reports output tokens/s, steps/s, host and device time per step and per "
    "bucket, and compilations after warmup (0 expected). Warmup is not timed.",
    flags.add_offline_flags,
    _bench_offline,
  ),
  (
    "structured",
    "structured-output throughput: JSON-schema requests vs unconstrained",
    "For each --concurrency C, C prompts unconstrained and then the same under a JSON schema, "
    "on one warmed engine: output tokens/s of both, their ratio, and the host time per step "
    "spent filling the grammar masks.",
    flags.add_structured_flags,
    _bench_structured,
  ),
  (
    "prefix-cache",
    "prefix caching on against off: a shared system prompt at an arrival rate",
    "Requests sharing a long system prompt arrive at --request-rate; the engine runs them with "
    "prefix caching on, then off (each in a fresh process): hit rate, prompt tokens computed, "
    "TTFT p50/p99 and output tokens/s side by side.",
    flags.add_prefix_cache_flags,
    _bench_prefix_cache,
  ),
  (
    "startup",
    "start-up costs: weight loading (GB/s), the KV pool and warmup",
    "Times loading the checkpoint's weights onto the devices, sizing the KV pool as the server "
    "does and (with --warmup full) compiling every bucket, in this process.",
    flags.add_startup_flags,
    requiring(_bench_startup, lambda args: [TORCH] if args.build else []),
  ),
  (
    "server-startup",
    "`jaxserve serve` start-up: fresh, under load, and a warm restart",
    "Starts `jaxserve serve` with an empty compilation cache and times /health, a first "
    "completion and the background compilation; runs a mixed workload (0 compilations "
    "expected); then restarts on the same cache and times it again.",
    flags.add_server_startup_flags,
    requiring(_bench_server_startup, lambda args: [HTTPX]),
  ),
  (
    "batch-invariance",
    "does a greedy request give the same tokens alone and in a crowd?",
    "Greedy probe requests alone, among other requests, preempted and on prefix-cache hits, "
    "compared bitwise (tokens and logprobs), with component checks that say which part of a "
    "step changes bits with the batch.",
    flags.add_batch_invariance_flags,
    _bench_batch_invariance,
  ),
)
