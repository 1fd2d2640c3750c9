"""Subcommands `eval` and `kv-plan` for the `jaxserve` command (the benchmarks' are in
jaxserve/bench/cli.py).

`jaxserve.cli`'s table takes COMMANDS (config/subcommands.py records); each command imports its
module only when it runs, so `jaxserve --help` stays fast and torch / matplotlib are needed only
by the commands using them (checked first: jaxserve/runtime/optional_deps.py). Files are written
only when asked (`--out`, `--out-dir`); nothing lands in ./out/ by default.
"""

from __future__ import annotations

import argparse

from jaxserve.config.cli_args import add_engine_args
from jaxserve.config.subcommands import Subcommand
from jaxserve.runtime.optional_deps import MATPLOTLIB, TORCH, TRANSFORMERS, requiring


def _eval_flags(parser: argparse.ArgumentParser) -> None:
  add_engine_args(parser)
  parser.add_argument(
    "--tasks",
    default="builtin",
    help="comma-separated JSONL files, or 'builtin' for the shipped tasks",
  )
  parser.add_argument("--limit", type=int, help="at most this many examples per task file")
  parser.add_argument("--parity-hf", action="store_true")
  parser.add_argument("--plot", action="store_true", help="also write a PNG bar chart")
  parser.add_argument(
    "--out-dir", help="write eval.json, eval.md (and eval.png) here (default: print only)"
  )


def _kv_plan_flags(parser: argparse.ArgumentParser) -> None:
  add_engine_args(parser)
  parser.add_argument(
    "--memory-gb", type=float, help="KV budget in GiB (default: what the engine config would use)"
  )
  parser.add_argument("--avg-seq-len", type=int, default=512)
  parser.add_argument(
    "--check",
    action="store_true",
    help="build the real engine on this device and compare its page count",
  )
  parser.add_argument("--out", help="write the plan as JSON to this file (default: print only)")


# Each command imports its module when it runs.
def _eval(args: argparse.Namespace) -> int:
  from jaxserve.tools import eval_harness

  return eval_harness.main(args)


def _kv_plan(args: argparse.Namespace) -> int:
  from jaxserve.tools import kv_plan

  return kv_plan.main(args)


COMMANDS: tuple[Subcommand, ...] = (
  Subcommand(
    "eval",
    help="offline eval on JSONL task files (generate / multiple choice / perplexity)",
    description="Scores JSONL task files through LLM.generate; --parity-hf also runs "
    "transformers and reports greedy agreement and logprob differences.",
    add_flags=_eval_flags,
    run=requiring(
      _eval,
      lambda args: (
        ([TORCH, TRANSFORMERS] if args.parity_hf else []) + ([MATPLOTLIB] if args.plot else [])
      ),
    ),
  ),
  Subcommand(
    "kv-plan",
    help="how many tokens and sequences a KV budget holds, paged vs contiguous",
    description="Paged (ceil(len/page) pages per sequence) against a contiguous max_model_len "
    "reservation per sequence, for a model and a memory budget.",
    add_flags=_kv_plan_flags,
    run=_kv_plan,
  ),
)
