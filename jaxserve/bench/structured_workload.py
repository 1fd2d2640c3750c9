"""The structured-output benchmarks' workload: a JSON schema and a tokenizer it can match.

SCHEMA has nested objects, arrays, enums and a pattern, so llguidance's masks are not trivial;
its strings, arrays and numbers are bounded, so that even a random model writes a whole document
in a few hundred bytes (greedy decoding on tiny-random: ~230). `check_workload` refuses an engine
on which no request could end with a valid document: a tokenizer that cannot write the JSON (a
random checkpoint's word-level one has no JSON punctuation) or an output budget shorter than
MINIMAL_DOCUMENT in its tokens.
`synthetic_tokenizer(num_tokens, model_vocab)` is a byte-level BPE of `num_tokens` pieces: the
256 byte characters, then generated pieces (words with and without a leading space, written
"Ġ" as ByteLevel does; numbers; JSON fragments such as `":` or `{"`), no merges, with bos
`<|begin|>` and eos `<|eot|>` after the pieces, for a model of `model_vocab` rows. Llama 3 has
128,000 pieces; the mask work llguidance does per step scales with that size. The same seed
gives the same pieces. Used by bench_structured (serving under the schema) and
investigations/bench_bitmask_fill.py (the host time of the mask fill alone).
"""

from __future__ import annotations

import json
import string

import numpy as np
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from jaxserve.structured import GrammarCompiler, SequenceMatcher, StructuredOutputSpec
from jaxserve.tokenizer import SpecialTokens, Tokenizer

_TEXT = {"type": "string", "maxLength": 8}
SCHEMA = {
  "type": "object",
  "additionalProperties": False,
  "required": ["id", "name", "email", "status", "address", "tags", "history"],
  "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 99999},
    "name": _TEXT,
    "email": _TEXT,
    "status": {"enum": ["active", "inactive", "banned"]},
    "score": {"type": "integer", "minimum": 0, "maximum": 100},
    "address": {
      "type": "object",
      "required": ["street", "city"],
      "additionalProperties": False,
      "properties": {
        "street": _TEXT,
        "city": _TEXT,
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
      },
    },
    "tags": {"type": "array", "maxItems": 2, "items": _TEXT},
    "history": {
      "type": "array",
      "maxItems": 2,
      "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["date", "event"],
        "properties": {"date": _TEXT, "event": _TEXT},
      },
    },
  },
}
# the required fields with their shortest values: the fewest tokens a valid output can have
MINIMAL_DOCUMENT = {
  "id": 0,
  "name": "",
  "email": "",
  "status": "active",
  "address": {"street": "", "city": ""},
  "tags": [],
  "history": [],
}


def check_workload(tokenizer: Tokenizer, compiler: GrammarCompiler, output_len: int) -> int:
  """The tokens of MINIMAL_DOCUMENT; ValueError saying why no request could end with a valid
  document when the tokenizer cannot write it or `output_len` is shorter."""
  text = json.dumps(MINIMAL_DOCUMENT, separators=(",", ":"), sort_keys=True)  # the schema's order
  ids = tokenizer.encode(text, add_special_tokens=False)
  decoded = tokenizer.decode(ids)
  if decoded != text:
    raise ValueError(
      f"tokenizer: cannot write the schema's JSON: {text[:32]!r} encodes to tokens that decode "
      f"to {decoded[:32]!r} (a random checkpoint's word-level tokenizer has no JSON "
      "punctuation); serve with --synthetic-bpe-vocab N"
    )
  spec = StructuredOutputSpec.json_schema(SCHEMA)
  matcher = SequenceMatcher(compiler.compile(spec), compiler.info)
  if not (matcher.consume(ids) and matcher.is_accepting()):
    raise ValueError(f"tokenizer: the schema's grammar rejects the tokens of {text!r}")
  if output_len < len(ids):
    raise ValueError(
      f"output_len: {output_len} tokens are fewer than the smallest valid document takes "
      f"({len(ids)} with this tokenizer): every constrained request would end by max_tokens; "
      "raise --output-len"
    )
  return len(ids)


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
      piece = fragments[rng.integers(len(fragments))] + "".join(
        rng.choice(letters, size=rng.integers(0, 4))
      )
    pieces.setdefault(piece)
  return list(pieces)


def synthetic_tokenizer(num_tokens: int, model_vocab: int) -> Tokenizer:
  vocab = {piece: i for i, piece in enumerate(synthetic_vocab(num_tokens))}
  backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  backend.add_special_tokens([AddedToken(t, special=True) for t in ("<|begin|>", "<|eot|>")])
  special = SpecialTokens(bos_token="<|begin|>", eos_token="<|eot|>")
  return Tokenizer(backend, special_tokens=special, vocab_size=model_vocab)
