"""The flags of `jaxserve bench soak` (and `python -m jaxserve.bench.soak`), kept apart from the
soak itself so `jaxserve --help` imports neither httpx nor numpy."""

from __future__ import annotations

import argparse


def add_soak_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--base-url", default="http://127.0.0.1:8000")
  parser.add_argument("--api-key")
  parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
  parser.add_argument(
    "--request-rate",
    type=float,
    help="arrivals per second (Poisson); default: --load times the capacity measured first",
  )
  parser.add_argument("--load", type=float, default=1.5, help="multiple of measured capacity")
  parser.add_argument(
    "--capacity-seconds", type=float, default=20.0, help="how long the capacity is measured"
  )
  parser.add_argument(
    "--capacity-concurrency",
    type=int,
    default=32,
    help="closed-loop clients while the capacity is measured",
  )
  parser.add_argument("--max-tokens", type=int, default=64, help="largest max_tokens of a call")
  parser.add_argument("--cancel-share", type=float, default=0.1, help="calls that leave mid-stream")
  parser.add_argument("--bad-share", type=float, default=0.05, help="calls that are bad inputs")
  parser.add_argument(
    "--canary-every", type=float, default=10.0, help="seconds between greedy canary calls"
  )
  parser.add_argument(
    "--canaries-must-match",
    action="store_true",
    help="a canary that differs from the first is a problem (a batch_invariant server)",
  )
  parser.add_argument(
    "--kill-api-every",
    type=float,
    help="SIGKILL an API server process every this many seconds (the server on this machine)",
  )
  parser.add_argument(
    "--stall-every",
    type=float,
    help="every this many seconds a client sends a long stream and stops reading it for "
    "--stall-hold seconds (a stopped client process)",
  )
  parser.add_argument(
    "--stall-hold", type=float, default=60.0, help="how long a stalled client reads nothing"
  )
  parser.add_argument("--window", type=float, default=60.0, help="seconds per report row")
  parser.add_argument(
    "--rss-growth", type=float, default=0.2, help="allowed RSS growth, last window vs first"
  )
  parser.add_argument(
    "--latency-drift", type=float, default=0.2, help="allowed p99 growth, last window vs first"
  )
  parser.add_argument(
    "--device-memory-growth",
    type=float,
    default=0.05,
    help="allowed growth of the engine's device memory (/metrics), last window vs first",
  )
  parser.add_argument(
    "--client-processes",
    type=int,
    default=1,
    help="processes sending the calls (one parses near 10k chunks/s; the report warns when "
    "they were the bottleneck)",
  )
  parser.add_argument("--plot", help="draw the per-window rows into this PNG (matplotlib)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", help="write the rows, summary and problems to this JSON file")
