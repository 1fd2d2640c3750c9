"""Host time to fill structured-output bitmasks: B sequences under a JSON schema, one step each.

Builds a synthetic byte-level BPE vocabulary of the size of Llama 3's (128,000 tokens + specials,
128,256-row model vocabulary: words with and without a leading space, numbers, punctuation and
JSON fragments; jaxserve/bench/structured_workload.py), so llguidance walks a trie of that size.
Each of B matchers is first advanced by a random number of random-model steps (sequences at
different positions, as in a real batch), then every timed step fills all B rows with
BitmaskFiller.fill (llguidance's thread pool) and consumes one token per sequence. Prints JSON:
per-step fill and consume milliseconds.

    python -m investigations.bench_bitmask_fill --batch 64 256 --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from jaxserve.bench.structured_workload import SCHEMA, synthetic_tokenizer
from jaxserve.structured import (
  BitmaskFiller,
  GrammarCompiler,
  GrammarState,
  SequenceMatcher,
  StructuredOutputSpec,
  build_llg_tokenizer,
)


def _allowed(row: np.ndarray, vocab: int) -> np.ndarray:
  return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab])


def _pick(rng, row: np.ndarray, vocab: int, eos: int) -> int:
  allowed = _allowed(row, vocab)
  non_eos = allowed[allowed != eos]
  return int(rng.choice(non_eos)) if len(non_eos) else eos


def run(batch: int, steps: int, warm_steps: int, compiler, filler, info, rng) -> dict:
  spec = StructuredOutputSpec.json_schema(SCHEMA)
  matchers = [SequenceMatcher(compiler.compile(spec), info) for _ in range(batch)]
  eos = info.eos_token_ids[0]
  for matcher in matchers:  # spread the sequences over the schema
    single = filler.new_bitmask(1)
    for _ in range(int(rng.integers(0, warm_steps))):
      matcher.fill_bitmask(single, 0)
      matcher.consume([_pick(rng, single[0], info.vocab_size, eos)])
  out = filler.new_bitmask(batch)
  fill_ms, consume_ms = [], []
  for _ in range(steps):
    rows = [(m, i) for i, m in enumerate(matchers) if m.state is GrammarState.ACTIVE]
    report = filler.fill(rows, batch, out=out)
    fill_ms.append(report.seconds * 1e3)
    picks = [(m, _pick(rng, out[i], info.vocab_size, eos)) for m, i in rows]
    start = time.perf_counter()
    filler.consume(picks)
    consume_ms.append((time.perf_counter() - start) * 1e3)
  return {
    "batch": batch,
    "fill_ms_median": float(np.median(fill_ms)),
    "fill_ms_p90": float(np.percentile(fill_ms, 90)),
    "consume_ms_median": float(np.median(consume_ms)),
    "active_rows_last_step": len(rows),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--warm-steps", type=int, default=60)
  parser.add_argument("--vocab", type=int, default=128000)
  parser.add_argument("--model-vocab", type=int, default=128256)
  parser.add_argument(
    "--threads", type=int, default=None, help="LLExecutor threads (default: llguidance's)"
  )
  opts = parser.parse_args()
  start = time.perf_counter()
  tokenizer = synthetic_tokenizer(opts.vocab, opts.model_vocab)
  built = time.perf_counter()
  llg_tokenizer, info = build_llg_tokenizer(tokenizer, opts.model_vocab)
  llg_built = time.perf_counter()
  compiler = GrammarCompiler(llg_tokenizer, info)
  compiler.validate(StructuredOutputSpec.json_schema(SCHEMA))
  compiled = time.perf_counter()
  filler = BitmaskFiller(info, opts.threads)
  rng = np.random.default_rng(0)
  results = [run(b, opts.steps, opts.warm_steps, compiler, filler, info, rng) for b in opts.batch]
  print(
    json.dumps(
      {
        "cpus": os.cpu_count(),
        "threads": opts.threads,
        "vocab": opts.vocab,
        "model_vocab": opts.model_vocab,
        "build_tokenizer_s": built - start,
        "build_llg_tokenizer_s": llg_built - built,
        "compile_schema_s": compiled - llg_built,
        "results": results,
      },
      indent=2,
    )
  )


if __name__ == "__main__":
  main()
