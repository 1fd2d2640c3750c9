"""Offline engine throughput on one machine: output tokens/s, steps/s and host ms per step.

    jaxserve bench offline                                       # built-in tiny-random model
    jaxserve bench offline --model /path/to/ckpt --num-prompts 256 --input-len 512
    python -m jaxserve.bench.bench_offline ...                   # the same flags

Random token prompts with fixed lengths (ignore_eos, greedy), all submitted at once; warmup
(compiling every bucket) is excluded from the timed region. Prints a table; writes JSON to --out
when asked, with a short digest of each request's tokens (`token_digests`) so that runs on other
layouts or cards can be checked for the same output.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import platform
import pstats
import sys
import time
from pathlib import Path

import jax
import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.bench.flags import add_offline_flags, standalone_parser
from jaxserve.composition.assembly import build_engine
from jaxserve.config.cli_args import engine_config_from_args
from jaxserve.config.device_defaults import Usage
from jaxserve.device.platforms import prepare_jax_process
from jaxserve.tools.json_file import write_json
from jaxserve.tools.key_value_table import key_value_table


def parse_args(argv=None) -> argparse.Namespace:
  parser = standalone_parser("bench_offline", __doc__)
  add_offline_flags(parser)
  return parser.parse_args(argv)


def run_steps(engine, tokens: dict[str, list[int]]) -> int:
  """Steps the engine until every request finished; returns the number of output tokens and
  appends each request's tokens to `tokens[request_id]`."""
  num_output = 0
  while engine.has_unfinished_requests():
    for output in engine.step():
      tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
      num_output += len(output.new_token_ids)
  return num_output


def token_digests(tokens: dict[str, list[int]], num_prompts: int) -> list[str]:
  """A short sha256 of each request's output tokens, in prompt order: two runs of the same
  prompts (another layout, another card) produced the same tokens where the digests agree."""
  return [
    hashlib.sha256(np.asarray(tokens.get(f"bench-{i}", []), np.int64).tobytes()).hexdigest()[:16]
    for i in range(num_prompts)
  ]


def profiled(fn, path: str):
  """fn() under cProfile; the top functions by own time go to `path`."""
  profiler = cProfile.Profile()
  result = profiler.runcall(fn)
  stream = io.StringIO()
  pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(40)
  Path(path).parent.mkdir(parents=True, exist_ok=True)
  Path(path).write_text(stream.getvalue())
  return result


def run(args: argparse.Namespace) -> dict:
  config = engine_config_from_args(args)
  prepare_jax_process(config.cache.memory_fraction)  # as LLM(...) does, before jax starts
  engine = build_engine(config, show_progress=True, usage=Usage(args.defaults_for))
  vocab = min(engine.vocab_size, engine.tokenizer.vocab_size)
  rng = np.random.default_rng(args.seed)
  params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
  for i in range(args.num_prompts):
    engine.add_request(
      rng.integers(0, vocab, size=args.input_len).tolist(),
      params,
      request_id=f"bench-{i}",
      stream=not args.no_stream,
    )
  compiled_before = engine.ledger.num_compilations
  tokens: dict[str, list[int]] = {}
  start = time.perf_counter()
  if args.profile_host:
    num_output = profiled(lambda: run_steps(engine, tokens), args.profile_host)
  else:
    num_output = run_steps(engine, tokens)
  elapsed = time.perf_counter() - start
  timings = engine.timings
  return {
    "model": config.model,
    "backend": jax.default_backend(),
    "device": str(jax.devices()[0].device_kind),
    "jax": jax.__version__,
    "python": platform.python_version(),
    "num_prompts": args.num_prompts,
    "input_len": args.input_len,
    "output_len": args.output_len,
    "elapsed_s": elapsed,
    "output_tokens": num_output,
    "output_tokens_per_s": num_output / elapsed,
    "total_tokens_per_s": (num_output + args.num_prompts * args.input_len) / elapsed,
    "steps": timings.num_steps,
    "steps_per_s": timings.num_steps / elapsed,
    "host_ms_per_step": 1e3 * timings.host_seconds / max(timings.num_steps, 1),
    "device_ms_per_step": 1e3 * timings.device_seconds / max(timings.num_steps, 1),
    "wait_ms_per_step": 1e3 * timings.wait_seconds / max(timings.num_steps, 1),
    "host_phase_ms_per_step": {
      name: 1e3 * sec / max(timings.num_steps, 1) for name, sec in timings.host_phases.items()
    },
    "async_scheduling": engine.async_scheduling,
    "streamed": not args.no_stream,
    "defaults_for": args.defaults_for,
    "max_num_seqs": engine.config.scheduler.max_num_seqs,
    "max_num_batched_tokens": engine.config.scheduler.max_num_batched_tokens,
    "compilations_after_warmup": engine.ledger.num_compilations - compiled_before,
    "warmup_s": engine.warmup_seconds,
    **pool_capacity(engine, args.input_len + args.output_len),
    "per_bucket": {
      f"{s}x{t}": {
        "steps": n,
        "device_ms_per_step": 1e3 * sec / n,
        "host_ms_per_step": _host_ms(timings, (s, t)),
      }
      for (s, t), (n, sec) in sorted(timings.per_bucket.items())
    },
    "token_digests": token_digests(tokens, args.num_prompts),
  }


def pool_capacity(engine, seq_len: int) -> dict[str, int]:
  """The KV pool in pages and in tokens of context: kv_pool_tokens with every KV group keeping
  every page (G pages per page of context), kv_pool_tokens_windowed in sequences of seq_len
  tokens whose sliding groups keep only their windows' pages (KVLayout.pages_held; equal with
  one group)."""
  layout = engine.scheduler.layout
  pages, page_size = engine.allocator.num_usable_pages, engine.allocator.page_size
  return {
    "kv_pool_pages": pages,
    "kv_pool_groups": layout.num_groups,
    "kv_pool_tokens": pages * page_size // layout.num_groups,
    "kv_pool_tokens_windowed": pages * seq_len // layout.pages_held(seq_len),
  }


def _host_ms(timings, bucket: tuple[int, int]) -> float | None:
  """Host ms per step() call that dispatched `bucket`."""
  steps, seconds = timings.host_per_bucket.get(bucket, (0, 0.0))
  return 1e3 * seconds / steps if steps else None


def main(argv=None) -> int:
  """The `python -m` entry: a bad configuration is one line on stderr and exit 2, as the
  `jaxserve` command reports it."""
  args = parse_args(argv)
  try:
    return command(args)
  except ValueError as err:
    print(f"bench_offline: error: {err}", file=sys.stderr)
    return 2


def command(args: argparse.Namespace) -> int:
  """The benchmark on parsed flags (`jaxserve bench offline` calls it)."""
  result = run(args)
  out = write_json(args.out, result) if args.out else None
  rows = [
    ("model", result["model"]),
    ("device", f"{result['device']} ({result['backend']})"),
    ("output tokens/s", f"{result['output_tokens_per_s']:.1f}"),
    ("total tokens/s", f"{result['total_tokens_per_s']:.1f}"),
    ("steps/s", f"{result['steps_per_s']:.2f}"),
    ("host ms/step", f"{result['host_ms_per_step']:.2f}"),
    ("device ms/step", f"{result['device_ms_per_step']:.2f}"),
    ("waiting for device ms/step", f"{result['wait_ms_per_step']:.2f}"),
    (
      "host phases ms/step",
      ", ".join(f"{k} {v:.2f}" for k, v in result["host_phase_ms_per_step"].items()),
    ),
    ("async scheduling / streamed", f"{result['async_scheduling']} / {result['streamed']}"),
    ("compilations after warmup", result["compilations_after_warmup"]),
    (
      "KV pool",
      f"{result['kv_pool_pages']} pages of {result['kv_pool_groups']} KV group(s): "
      f"{result['kv_pool_tokens']} tokens, {result['kv_pool_tokens_windowed']} with windows freed",
    ),
  ]
  rows += [
    (
      f"bucket {name}",
      f"{b['steps']} steps, {b['device_ms_per_step']:.2f} device ms/step"
      + ("" if b["host_ms_per_step"] is None else f", {b['host_ms_per_step']:.2f} host"),
    )
    for name, b in result["per_bucket"].items()
  ]
  print(key_value_table(rows))
  if out:
    print(f"wrote {out}")
  expected = result["num_prompts"] * result["output_len"]
  if result["output_tokens"] != expected:  # a run that lost requests is no measurement
    print(
      f"bench_offline: error: {result['output_tokens']} of {expected} output tokens generated",
      file=sys.stderr,
    )
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
