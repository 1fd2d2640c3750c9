"""Prefix caching on against off: requests sharing a long system prompt, at an arrival rate.

    jaxserve bench prefix-cache                     # tiny-random, CPU smoke run
    jaxserve bench prefix-cache --model /tmp/llama8b --config configs/h100.yaml \\
        --prefix-len 2000 --suffix-len 32 --num-prompts 200 --output-len 200 --request-rate 4
    python -m jaxserve.bench.bench_prefix_cache ...  # the same flags

Every prompt is the same --prefix-len random token ids (the system prompt) followed by
--suffix-len ids of its own; each asks for --output-len tokens (greedy, ignore_eos). Requests
arrive as a Poisson process at --request-rate (inf: all at once) and the engine runs in this
process, stepped by the benchmark loop, which adds each request when its arrival time has
passed. With --caching both (the default) the workload runs twice, caching on then off, each in a
fresh process (its own engine and KV pool) with the same prompts and arrival times, and the
table sets them side by side:

  hit rate         prompt tokens served by cached pages / prompt tokens submitted (the hits are
                   the engine's prefix_cache_hits, EngineStats, vLLM's counter)
  prefill tokens   prompt tokens computed: submitted - hit, plus the preemptions' recomputation
                   (the run's preemptions are reported; 0 expected at these loads)
  TTFT             from a request's arrival time to the step output that carries its first token
                   (queueing included), p50 / p99
  output tok/s     output tokens over the time from the first arrival to the last token

Warmup is not timed; compilations inside the timed region are reported (0 expected).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxserve.bench.flags import add_prefix_cache_flags, standalone_parser
from jaxserve.tools.json_file import write_json
from jaxserve.tools.key_value_table import key_value_table

MODULE = "jaxserve.bench.bench_prefix_cache"
RATIOS = ("prefill_tokens", "ttft_p50_ms", "ttft_p99_ms", "output_tokens_per_s")


def parse_args(argv=None) -> argparse.Namespace:
  parser = standalone_parser("bench_prefix_cache", __doc__)
  add_prefix_cache_flags(parser)
  return parser.parse_args(argv)


def workload(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], np.ndarray]:
  """The prompts (shared prefix + own suffix) and their arrival times in seconds."""
  rng = np.random.default_rng(args.seed)
  prefix = rng.integers(0, vocab, size=args.prefix_len).tolist()
  prompts = [
    prefix + rng.integers(0, vocab, size=args.suffix_len).tolist() for _ in range(args.num_prompts)
  ]
  if math.isinf(args.request_rate):
    return prompts, np.zeros(args.num_prompts)
  gaps = rng.exponential(1.0 / args.request_rate, size=args.num_prompts)  # [N]
  return prompts, np.cumsum(gaps) - gaps[0]


def drive(engine, prompts: list[list[int]], arrivals: np.ndarray, output_len: int) -> dict:
  """Adds each prompt at its arrival time and steps the engine until all finish; returns each
  request's TTFT (s), the elapsed time and the output token count."""
  from jaxserve.api.sampling_params import SamplingParams

  params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
  ttft: dict[str, float] = {}
  num_added, num_output = 0, 0
  start = time.monotonic()
  while num_added < len(prompts) or engine.has_unfinished_requests():
    now = time.monotonic() - start
    while num_added < len(prompts) and arrivals[num_added] <= now:
      engine.add_request(prompts[num_added], params, request_id=f"p{num_added}", stream=True)
      num_added += 1
    if not engine.has_unfinished_requests():
      time.sleep(max(0.0, arrivals[num_added] - (time.monotonic() - start)))
      continue
    for output in engine.step():
      num_output += len(output.new_token_ids)
      if output.new_token_ids and output.request_id not in ttft:
        arrival = arrivals[int(output.request_id[1:])]
        ttft[output.request_id] = time.monotonic() - start - arrival
  return {"ttft_s": list(ttft.values()), "elapsed_s": time.monotonic() - start, "out": num_output}


def run_one(args: argparse.Namespace, caching: bool) -> dict:
  """The workload on a fresh engine with prefix caching on or off (this process)."""
  from jaxserve.composition.assembly import build_engine
  from jaxserve.config.cli_args import engine_config_from_args
  from jaxserve.config.device_defaults import Usage
  from jaxserve.device.platforms import prepare_jax_process

  config = engine_config_from_args(args)
  scheduler = dataclasses.replace(config.scheduler, enable_prefix_caching=caching)
  config = config.replace(scheduler=scheduler)
  prepare_jax_process(config.cache.memory_fraction)
  engine = build_engine(config, show_progress=True, usage=Usage.SERVE)
  prompts, arrivals = workload(args, min(engine.vocab_size, engine.tokenizer.vocab_size))
  before, compiled = engine.stats(), engine.ledger.num_compilations
  result = drive(engine, prompts, arrivals, args.output_len)
  after = engine.stats()
  queries = sum(len(prompt) for prompt in prompts)
  hits = after.num_prefix_cache_hits - before.num_prefix_cache_hits
  ttft_ms = 1e3 * np.asarray(result["ttft_s"])
  engine.close()
  return {
    "prefix_caching": caching,
    "num_prompts": len(prompts),
    "prompt_tokens": queries,
    "hit_tokens": hits,
    "hit_rate": hits / max(queries, 1),
    "prefill_tokens": queries - hits,
    "ttft_p50_ms": float(np.percentile(ttft_ms, 50)),
    "ttft_p99_ms": float(np.percentile(ttft_ms, 99)),
    "elapsed_s": result["elapsed_s"],
    "output_tokens": result["out"],
    "output_tokens_per_s": result["out"] / result["elapsed_s"],
    "compilations": engine.ledger.num_compilations - compiled,
    "preemptions": after.num_preemptions - before.num_preemptions,
  }


def run_both(args: argparse.Namespace) -> dict:
  """Caching on, then off, each in a fresh process (`child`, given these flags on stdin)."""
  flags = {k: v for k, v in vars(args).items() if k != "func"}  # func: the CLI's handler
  runs = {}
  with tempfile.TemporaryDirectory() as tmp:
    for mode in ("on", "off"):
      out = Path(tmp) / f"{mode}.json"
      job = json.dumps({"flags": {**flags, "caching": mode}, "out": str(out)})
      code = f"import sys; from {MODULE} import child; sys.exit(child())"
      subprocess.run([sys.executable, "-c", code], input=job, text=True, check=True)
      runs[mode] = json.loads(out.read_text())
  return runs


def child() -> int:
  """One mode in this process: the flags and the result file's path come as JSON on stdin."""
  job = json.loads(sys.stdin.read())
  args = argparse.Namespace(**job["flags"])
  result = run_one(args, args.caching == "on")
  write_json(job["out"], result)
  return 0


def table(args: argparse.Namespace, runs: dict) -> str:
  rows = [
    (
      "workload",
      f"{args.num_prompts} x ({args.prefix_len} shared + {args.suffix_len}) / "
      f"{args.output_len} tokens, rate {args.request_rate}",
    ),
  ]
  for mode, r in runs.items():
    rows.append(
      (
        f"caching {mode}",
        f"hit rate {r['hit_rate']:.3f}, prefill tokens {r['prefill_tokens']}, TTFT p50/p99 "
        f"{r['ttft_p50_ms']:.1f}/{r['ttft_p99_ms']:.1f} ms, {r['output_tokens_per_s']:.1f} out "
        f"tok/s, {r['compilations']} compilations, {r['preemptions']} preemptions",
      )
    )
  if set(runs) == {"on", "off"}:
    on, off = runs["on"], runs["off"]
    ratio = {key: on[key] / max(off[key], 1e-9) for key in RATIOS}
    rows.append(
      (
        "on / off",
        f"prefill tokens {ratio['prefill_tokens']:.3f}, TTFT p50 {ratio['ttft_p50_ms']:.3f}, "
        f"p99 {ratio['ttft_p99_ms']:.3f}, output tok/s {ratio['output_tokens_per_s']:.3f}",
      )
    )
  return key_value_table(rows)


def command(args: argparse.Namespace) -> int:
  """The benchmark on parsed flags (`jaxserve bench prefix-cache` calls it)."""
  if args.caching == "both":
    runs = run_both(args)
  else:
    runs = {args.caching: run_one(args, args.caching == "on")}
  result = {"args": {k: v for k, v in vars(args).items() if k != "func"}, "runs": runs}
  if args.out:
    write_json(args.out, result)
  print(table(args, runs))
  return 0


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    return command(args)
  except ValueError as err:
    print(f"bench_prefix_cache: error: {err}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
