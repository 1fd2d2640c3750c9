"""Structured-output throughput: every request under a JSON schema vs unconstrained, same engine.

    jaxserve bench structured                      # tiny-random, CPU smoke run
    jaxserve bench structured --model /tmp/llama8b --synthetic-bpe-vocab 128000 \\
        --concurrency 64 256 --set scheduler.max_num_seqs=256 ...
    python -m jaxserve.bench.bench_structured ...  # the same flags

For each concurrency C it submits C prompts at once (random ids, input_len tokens), first each
under SCHEMA (greedy, max_tokens output_len: a request ends with its document, "stop", or is cut,
"length"; eos ignored but for the grammar's), then the same prompts unconstrained, each with
ignore_eos and as many tokens as its constrained twin wrote, so both runs produce the same tokens
with the same batch over time; on one warmed engine. It reports output tokens/s of both, their
ratio, the constrained requests' finish reasons and how many ended with a whole JSON document,
the host time per step spent on the masks (llguidance filling the constrained rows,
Constraints.fill; and the whole "bitmask" phase: fill, the mask's transfer and the sampler's
dispatch), plus compilations after warmup (must be 0).

It tells the truth about what it measured. Before any request runs it refuses (exit 2) an engine on
which no request could end with a valid document (structured_workload.check_workload): the
random-weight checkpoints' word-level tokenizer (vocab_tokenizer.py) has no JSON punctuation, so
--synthetic-bpe-vocab N replaces it with a byte-level BPE of N pieces
(structured_workload.synthetic_tokenizer: words, numbers, JSON fragments; Llama 3 has 128,000),
the vocabulary size llguidance's mask work scales with; and an --output-len shorter than the
smallest document is refused too. After the run, a concurrency where fewer than half the
constrained requests wrote a whole document gets a warning on stderr (the ratio then compares
cut or failed outputs), and a run where none did exits 1.

It also times the sampler's token-bitmask select in front of the greedy pick on the logits of C
rows (the cost every step pays since no SamplerMode switches the mask off; see device/sampler.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.bench.flags import add_structured_flags, standalone_parser
from jaxserve.bench.structured_workload import SCHEMA, check_workload, synthetic_tokenizer
from jaxserve.bench.timing import seconds_per_call
from jaxserve.composition.assembly import build_engine
from jaxserve.config import EngineConfig
from jaxserve.config.cli_args import engine_config_from_args
from jaxserve.config.device_defaults import Usage
from jaxserve.device.platforms import prepare_jax_process
from jaxserve.device.step_options import step_greedy
from jaxserve.device.token_bitmask import apply_token_bitmask, bitmask_words
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


def _counters(engine) -> tuple[float, ...]:
  timings, constraints = engine.timings, engine.constraints
  return (
    timings.num_steps,
    timings.host_phases.get("bitmask", 0.0),
    constraints.fill_seconds,
    constraints.num_fills,
    timings.host_seconds,
    timings.device_seconds,
    engine.ledger.num_compilations,
  )


def run_workload(
  engine, prompts: list[list[int]], max_tokens: list[int], constrained: bool
) -> dict:
  """The prompts at once, prompt i with max_tokens[i], ignore_eos: under SCHEMA (only the
  grammar ends a request, with the eos it allows once the document is whole: a model's eos ids
  may be ordinary pieces of the synthetic tokenizer), or unconstrained (exactly max_tokens[i])."""
  spec = StructuredOutputSpec.json_schema(SCHEMA) if constrained else None
  before = _counters(engine)
  for i, prompt in enumerate(prompts):
    params = SamplingParams(
      temperature=0.0,
      max_tokens=max_tokens[i],
      ignore_eos=True,
      structured_outputs=spec,
    )
    name = f"{'json' if constrained else 'plain'}-{i}"
    engine.add_request(prompt, params, request_id=name, stream=False)
  start = time.perf_counter()
  tokens: dict[int, int] = {}
  finish: dict[str, int] = {}
  valid = 0
  while engine.has_unfinished_requests():
    for output in engine.step():
      if output.finished:
        index = int(output.request_id.rsplit("-", 1)[1])
        tokens[index] = len(output.token_ids)
        reason = getattr(output.finish_reason, "value", str(output.finish_reason))
        finish[reason] = finish.get(reason, 0) + 1
        valid += reason == "stop" and _is_json(output.text)
  elapsed = time.perf_counter() - start
  after = _counters(engine)
  steps, fills = after[0] - before[0], after[3] - before[3]
  num_output = sum(tokens.values())
  return {
    "constrained": constrained,
    "requests": len(prompts),
    "elapsed_s": elapsed,
    "output_tokens": num_output,
    "output_tokens_per_s": num_output / elapsed,
    "tokens_per_request": [tokens[i] for i in range(len(prompts))],
    "finish_reasons": finish,
    "valid_documents": valid if constrained else None,
    "steps": steps,
    "host_ms_per_step": 1e3 * (after[4] - before[4]) / max(steps, 1),
    "device_ms_per_step": 1e3 * (after[5] - before[5]) / max(steps, 1),
    "mask_fill_ms_per_masked_step": 1e3 * (after[2] - before[2]) / max(fills, 1),
    "bitmask_phase_ms_per_masked_step": 1e3 * (after[1] - before[1]) / max(fills, 1),
    "masked_steps": fills,
    "compilations": after[6] - before[6],
  }


def _is_json(text: str) -> bool:
  try:
    json.loads(text)
  except json.JSONDecodeError:
    return False
  return True


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
  minimal_tokens = check_workload(engine.tokenizer, engine.constraints.compiler, args.output_len)
  grammar_setup_s = time.perf_counter() - start
  rng = np.random.default_rng(args.seed)
  vocab = min(engine.vocab_size, engine.tokenizer.vocab_size)
  rows = []
  for concurrency in args.concurrency:
    prompts = rng.integers(0, vocab, size=(concurrency, args.input_len)).tolist()
    constrained = run_workload(engine, prompts, [args.output_len] * concurrency, True)
    plain = run_workload(engine, prompts, constrained["tokens_per_request"], False)
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
    "minimal_document_tokens": minimal_tokens,
    "grammar_setup_s": grammar_setup_s,
    "warmup_s": engine.warmup_seconds,
    "results": rows,
  }


def main(argv=None) -> int:
  """The `python -m` entry: a refused run is one line on stderr and exit 2, as the `jaxserve`
  command reports it."""
  args = parse_args(argv)
  try:
    return command(args)
  except ValueError as err:
    print(f"bench_structured: error: {err}", file=sys.stderr)
    return 2


def finish_words(finish_reasons: dict[str, int]) -> str:
  """`stop: 3, length: 1`."""
  return ", ".join(f"{reason}: {count}" for reason, count in sorted(finish_reasons.items()))


def command(args: argparse.Namespace) -> int:
  """The benchmark on parsed flags (`jaxserve bench structured` calls it): 0, or 1 when no
  constrained request wrote a whole document (after a warning per such concurrency)."""
  result = run(args)
  if args.out:
    write_json(args.out, result)
  valid = 0
  for row in result["results"]:
    plain, json_run = row["unconstrained"], row["json_schema"]
    print(
      f"concurrency {row['concurrency']}: unconstrained {plain['output_tokens_per_s']:.1f} "
      f"tok/s, json_schema {json_run['output_tokens_per_s']:.1f} tok/s, ratio "
      f"{row['throughput_ratio']:.3f}; valid documents {json_run['valid_documents']} of "
      f"{json_run['requests']} (finish {finish_words(json_run['finish_reasons'])}); mask fill "
      f"{json_run['mask_fill_ms_per_masked_step']:.2f} ms/step (bitmask phase "
      f"{json_run['bitmask_phase_ms_per_masked_step']:.2f} ms), device "
      f"{json_run['device_ms_per_step']:.2f} vs {plain['device_ms_per_step']:.2f} ms/step; "
      f"compilations {plain['compilations'] + json_run['compilations']}; greedy select "
      f"{row['mask_select']['greedy_plain_us']:.0f} -> "
      f"{row['mask_select']['greedy_masked_us']:.0f} us"
    )
    valid += json_run["valid_documents"]
    if 2 * json_run["valid_documents"] < json_run["requests"]:
      _warn_cut(row["concurrency"], json_run, args.output_len)
  return 0 if valid else 1


def _warn_cut(concurrency: int, json_run: dict, output_len: int) -> None:
  print(
    f"WARNING: bench structured: at concurrency {concurrency} only "
    f"{json_run['valid_documents']} of {json_run['requests']} constrained requests wrote a "
    f"whole JSON document (finish {finish_words(json_run['finish_reasons'])}): the ratio "
    "compares outputs cut by max_tokens or failed, not structured generation; raise "
    f"--output-len (now {output_len})",
    file=sys.stderr,
  )


if __name__ == "__main__":
  raise SystemExit(main())
