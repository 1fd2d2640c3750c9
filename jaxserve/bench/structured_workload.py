"""The structured-output benchmarks' workload: a JSON schema and a tokenizer it can match.

SCHEMA has nested objects, arrays, enums and a pattern, so llguidance's masks are not trivial.
`synthetic_tokenizer(num_tokens, model_vocab)` is a byte-level BPE of `num_tokens` pieces: the
256 byte characters, then generated pieces (words with and without a leading space, written
"Ġ" as ByteLevel does; numbers; JSON fragments such as `":` or `{"`), no merges, with bos
`<|begin|>` and eos `<|eot|>` after the pieces, for a model of `model_vocab` rows. Llama 3 has
128,000 pieces; the mask work llguidance does per step scales with that size. The same seed
gives the same pieces. Used by bench_structured (serving under the schema) and
investigations/bench_bitmask_fill.py (the host time of the mask fill alone).
"""

from __future__ import annotations

import string

import numpy as np
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from jaxserve.tokenizer import SpecialTokens, Tokenizer

SCHEMA = {
  "type": "object",
  "additionalProperties": False,
  "required": ["id", "name", "email", "status", "address", "tags", "history"],
  "properties": {
    "id": {"type": "integer"},
    "name": {"type": "string"},
    "email": {"type": "string"},
    "status": {"enum": ["active", "inactive", "banned"]},
    "score": {"type": "number"},
    "address": {
      "type": "object",
      "required": ["street", "city"],
      "additionalProperties": False,
      "properties": {
        "street": {"type": "string"},
        "city": {"type": "string"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
      },
    },
    "tags": {"type": "array", "items": {"type": "string"}},
    "history": {
      "type": "array",
      "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["date", "event"],
        "properties": {"date": {"type": "string"}, "event": {"type": "string"}},
      },
    },
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
