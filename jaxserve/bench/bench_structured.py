"""Structured-output throughput: every request under a JSON schema vs unconstrained, same engine.

    jaxserve bench structured                      # tiny-random, CPU smoke run
    jaxserve bench structured --model /tmp/llama8b --synthetic-bpe-vocab 128000 \\
        --concurrency 64 256 --set scheduler.max_num_seqs=256 ...
    python -m jaxserve.bench.bench_structured ...  # the same flags

For each concurrency C it submits C prompts at once (random ids, input_len tokens) twice, first
unconstrained (ignore_eos, output_len tokens each), then every one under SCHEMA (same max_tokens;
a random model writes strings until max_tokens, so most run as long), on one warmed engine,
and reports output tokens/s of both, their ratio, and the host time per step spent on the masks
(llguidance filling the constrained rows, Constraints.fill; and the whole "bitmask" phase: fill,
the mask's transfer and the sampler's dispatch), plus compilations after warmup (must be 0).

The random-weight checkpoints' word-level tokenizer (vocab_tokenizer.py) has no JSON punctuation,
so a schema would match nothing: --synthetic-bpe-vocab N replaces it with a byte-level BPE of N
pieces (structured_workload.synthetic_tokenizer: words, numbers, JSON fragments; Llama 3 has
128,000), the vocabulary size llguidance's mask work scales with.

It also times the sampler's token-bitmask select in front of the greedy pick on the logits of C
rows (the cost every step pays since no SamplerMode switches the mask off; see device/sampler.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.assembly import build_engine
from jaxserve.bench.flags import add_structured_flags, standalone_parser
from jaxserve.bench.structured_workload import SCHEMA, synthetic_tokenizer
from jaxserve.bench.timing import seconds_per_call
from jaxserve.cli_args import engine_config_from_args
from jaxserve.config import EngineConfig
from jaxserve.defaults import Usage
from jaxserve.device.step_options import step_greedy
from jaxserve.device.token_bitmask import apply_token_bitmask, bitmask_words
from jaxserve.platforms import prepare_jax_process
from jaxserve.sampling_params import SamplingParams
from jaxserve.structured import StructuredOutputSpec
from jaxserve.tools.json_file import write_json


def parse_args(argv=None) -> argparse.Namespace:
  parser = standalone_parser("bench_structured", __doc__)
  add_structured_flags(parser)
  return parser.parse_args(argv)


def write_synthetic_tokenizer(
  num_pieces: int, model_vocab: int, out_dir: Path, chat_template: str | None = None
) -> Path:
  """tokenizer.json + tokenizer_config.json of the synthetic BPE (bos, eos after the pieces),
  with `chat_template` when given (a server's chat calls need one)."""
  tokenizer = synthetic_tokenizer(num_pieces, model_vocab)
  out_dir.mkdir(parents=True, exist_ok=True)
  tokenizer.backend.save(str(out_dir / "tokenizer.json"))
  config = {"bos_token": "<|begin|>", "eos_token": "<|eot|>", "add_bos_token": False}
  if chat_template is not None:
    config["chat_template"] = chat_template
  (out_dir / "tokenizer_config.json").write_text(json.dumps(config))
  return out_dir


def run_workload(engine, num_prompts: int, args, constrained: bool, rng) -> dict:
  spec = StructuredOutputSpec.json_schema(SCHEMA) if constrained else None
  params = SamplingParams(
    temperature=0.0, max_tokens=args.output_len, ignore_eos=not constrained, structured_outputs=spec
  )
  vocab = min(engine.vocab_size, engine.tokenizer.vocab_size)
  constraints, timings = engine.constraints, engine.timings
  before = (
    timings.num_steps,
    timings.host_phases.get("bitmask", 0.0),
    constraints.fill_seconds,
    constraints.num_fills,
    timings.host_seconds,
    timings.device_seconds,
  )
  compiled = engine.ledger.num_compilations
  for i in range(num_prompts):
    engine.add_request(
      rng.integers(0, vocab, size=args.input_len).tolist(),
      params,
      request_id=f"{'json' if constrained else 'plain'}-{num_prompts}-{i}",
      stream=False,
    )
  start = time.perf_counter()
  num_output, finish = 0, {}
  while engine.has_unfinished_requests():
    for output in engine.step():
      num_output += len(output.new_token_ids)
      if output.finished:
        finish[output.finish_reason] = finish.get(output.finish_reason, 0) + 1
  elapsed = time.perf_counter() - start
  steps = timings.num_steps - before[0]
  fills = constraints.num_fills - before[3]
  return {
    "constrained": constrained,
    "requests": num_prompts,
    "elapsed_s": elapsed,
    "output_tokens": num_output,
    "output_tokens_per_s": num_output / elapsed,
    "finish_reasons": finish,
    "steps": steps,
    "host_ms_per_step": 1e3 * (timings.host_seconds - before[4]) / max(steps, 1),
    "device_ms_per_step": 1e3 * (timings.device_seconds - before[5]) / max(steps, 1),
    "mask_fill_ms_per_masked_step": 1e3 * (constraints.fill_seconds - before[2]) / max(fills, 1),
    "bitmask_phase_ms_per_masked_step": 1e3
    * (timings.host_phases.get("bitmask", 0.0) - before[1])
    / max(fills, 1),
    "masked_steps": fills,
    "compilations": engine.ledger.num_compilations - compiled,
  }


def time_mask_select(config: EngineConfig, rows: int, vocab: int) -> dict:
  """Device time per call of the greedy pick with and without the all-ones bitmask select."""
  greedy = step_greedy(config, sharded=False)
  logits = jax.random.normal(jax.random.key(0), (rows, vocab), jnp.float32)  # [S, V]
  banned = jnp.full((rows, 8), -1, jnp.int32)  # [S, 8]
  ones = jnp.full((rows, bitmask_words(vocab)), -1, jnp.int32)  # [S, W]
  plain = jax.jit(lambda x, b, m: greedy(x, b))
  masked = jax.jit(lambda x, b, m: greedy(apply_token_bitmask(x, m), b))
  return {
    f"greedy_{name}_us": 1e6 * seconds_per_call(fn, logits, banned, ones, inner=20, reps=5)
    for name, fn in (("plain", plain), ("masked", masked))
  }


def run(args: argparse.Namespace) -> dict:
  config = engine_config_from_args(args)
  prepare_jax_process(config.cache.memory_fraction)
  if args.synthetic_bpe_vocab:
    model_vocab = json.loads((Path(config.model) / "config.json").read_text())["vocab_size"]
    directory = write_synthetic_tokenizer(
      args.synthetic_bpe_vocab, model_vocab, Path(tempfile.mkdtemp(prefix="bench_structured_"))
    )
    config = dataclasses.replace(config, tokenizer=str(directory))
  engine = build_engine(config, show_progress=True, usage=Usage.OFFLINE)
  start = time.perf_counter()
  engine.constraints.compiler.validate(StructuredOutputSpec.json_schema(SCHEMA))
  grammar_setup_s = time.perf_counter() - start
  rng = np.random.default_rng(args.seed)
  rows = []
  for concurrency in args.concurrency:
    plain = run_workload(engine, concurrency, args, False, rng)
    constrained = run_workload(engine, concurrency, args, True, rng)
    rows.append(
      {
        "concurrency": concurrency,
        "unconstrained": plain,
        "json_schema": constrained,
        "throughput_ratio": constrained["output_tokens_per_s"] / plain["output_tokens_per_s"],
        "mask_select": time_mask_select(config, concurrency, engine.vocab_size),
      }
    )
  return {
    "model": config.model,
    "device": str(jax.devices()[0].device_kind),
    "backend": jax.default_backend(),
    "vocab_size": engine.vocab_size,
    "tokenizer_vocab": engine.tokenizer.vocab_size,
    "input_len": args.input_len,
    "output_len": args.output_len,
    "grammar_setup_s": grammar_setup_s,
    "warmup_s": engine.warmup_seconds,
    "results": rows,
  }


def main(argv=None) -> int:
  return command(parse_args(argv))


def command(args: argparse.Namespace) -> int:
  """The benchmark on parsed flags (`jaxserve bench structured` calls it)."""
  result = run(args)
  if args.out:
    write_json(args.out, result)
  for row in result["results"]:
    plain, json_run = row["unconstrained"], row["json_schema"]
    print(
      f"concurrency {row['concurrency']}: unconstrained {plain['output_tokens_per_s']:.1f} "
      f"tok/s, json_schema {json_run['output_tokens_per_s']:.1f} tok/s, ratio "
      f"{row['throughput_ratio']:.3f}; mask fill {json_run['mask_fill_ms_per_masked_step']:.2f}"
      f" ms/step (bitmask phase {json_run['bitmask_phase_ms_per_masked_step']:.2f} ms), "
      f"device {json_run['device_ms_per_step']:.2f} vs {plain['device_ms_per_step']:.2f} "
      f"ms/step; finish {json_run['finish_reasons']}; compilations "
      f"{plain['compilations'] + json_run['compilations']}; greedy select "
      f"{row['mask_select']['greedy_plain_us']:.0f} -> "
      f"{row['mask_select']['greedy_masked_us']:.0f} us"
    )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
