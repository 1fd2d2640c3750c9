"""Host time to fill structured-output bitmasks: B sequences under a JSON schema, one step each.

Builds a synthetic byte-level BPE vocabulary of the size of Llama 3's (128,000 tokens + specials,
128,256-row model vocabulary: words with and without a leading space, numbers, punctuation and
JSON fragments), so llguidance walks a trie of that size. Each of B matchers is first advanced by
a random number of random-model steps (sequences at different positions, as in a real batch),
then every timed step fills all B rows with BitmaskFiller.fill (llguidance's thread pool) and
consumes one token per sequence. Prints JSON: per-step fill and consume milliseconds.

    python -m jaxserve.bench.bench_bitmask_fill --batch 64 256 --steps 30
"""
from __future__ import annotations

import argparse
import json
import os
import string
import time

import numpy as np
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from jaxserve.structured import (BitmaskFiller, GrammarCompiler, GrammarState, SequenceMatcher,
                                 StructuredOutputSpec, build_llg_tokenizer)
from jaxserve.tokenizer import SpecialTokens, Tokenizer

SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "name", "email", "status", "address", "tags", "history"],
    "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "email": {"type": "string"},
        "status": {"enum": ["active", "inactive", "banned"]}, "score": {"type": "number"},
        "address": {"type": "object", "required": ["street", "city"], "additionalProperties": False,
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
        "tags": {"type": "array", "items": {"type": "string"}},
        "history": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["date", "event"],
            "properties": {"date": {"type": "string"}, "event": {"type": "string"}}}},
    },
}


def _byte_chars() -> list[str]:
  return list(pre_tokenizers.ByteLevel.alphabet())


def synthetic_vocab(num_tokens: int, seed: int = 0) -> list[str]:
  """ByteLevel-encoded pieces ("Ġ" is a leading space): the 256 bytes, then generated pieces."""
  rng = np.random.default_rng(seed)
  pieces = dict.fromkeys(sorted(_byte_chars()))
  letters = np.array(list(string.ascii_lowercase))
  fragments = ['":', '",', '{"', '"}', '":"', '","', '":[', '],"', "},{", '":{"', '"]', "\\n"]
  while len(pieces) < num_tokens:
    kind = rng.integers(0, 10)
    if kind < 7:
      word = "".join(rng.choice(letters, size=rng.integers(2, 10)))
      word = word.capitalize() if rng.random() < 0.2 else word
      piece = ("Ġ" + word) if rng.random() < 0.6 else word
    elif kind < 9:
      piece = str(rng.integers(0, 1000))
    else:
      piece = fragments[rng.integers(len(fragments))] + "".join(rng.choice(letters, size=rng.integers(0, 4)))
    pieces.setdefault(piece)
  return list(pieces)


def synthetic_tokenizer(num_tokens: int, model_vocab: int) -> Tokenizer:
  vocab = {piece: i for i, piece in enumerate(synthetic_vocab(num_tokens))}
  backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  backend.add_special_tokens([AddedToken(t, special=True) for t in ("<|begin|>", "<|eot|>")])
  return Tokenizer(backend, special_tokens=SpecialTokens(bos_token="<|begin|>", eos_token="<|eot|>"),
                   vocab_size=model_vocab)


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
  return {"batch": batch, "fill_ms_median": float(np.median(fill_ms)),
          "fill_ms_p90": float(np.percentile(fill_ms, 90)),
          "consume_ms_median": float(np.median(consume_ms)),
          "active_rows_last_step": len(rows)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--warm-steps", type=int, default=60)
  parser.add_argument("--vocab", type=int, default=128000)
  parser.add_argument("--model-vocab", type=int, default=128256)
  parser.add_argument("--threads", type=int, default=None, help="LLExecutor threads (default: llguidance's)")
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
  print(json.dumps({"cpus": os.cpu_count(), "threads": opts.threads, "vocab": opts.vocab,
                    "model_vocab": opts.model_vocab, "build_tokenizer_s": built - start,
                    "build_llg_tokenizer_s": llg_built - built, "compile_schema_s": compiled - llg_built,
                    "results": results}, indent=2))


if __name__ == "__main__":
  main()
