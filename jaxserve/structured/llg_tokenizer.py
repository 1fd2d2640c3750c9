"""llguidance's `LLTokenizer` built from a jaxserve `Tokenizer`.

llguidance needs each token id's bytes to walk its token trie when it computes a mask. Two ways:
* from tokenizer.json (the `tokenizers` backend serialized): llguidance reads the vocabulary and
  decoder itself. This covers ByteLevel tokenizers (GPT-2, Llama 3, Qwen, the tiny-random byte
  tokenizer) and the usual SentencePiece-style decoders it recognizes;
* otherwise (a decoder llguidance does not recognize, e.g. a Replace/Fuse/Strip sequence), from a
  table of token bytes computed here: `<0xHH>` byte-fallback pieces are that byte, special tokens
  their text, and any other token the text it adds after an anchor token (decode([anchor, id])
  minus decode([anchor])), which keeps the leading space a "▁" decodes to.

The model's vocabulary may be larger than the tokenizer's (embeddings padded to a multiple of 64 or
128); `model_vocab_size` makes llguidance size its masks to the model, and ids past the tokenizer
are never allowed. The eos ids are the tokenizer's (eos plus generation_config's extra ones, e.g.
Llama 3's <|eot_id|>); a constrained sequence may end only with them, and only where the grammar
accepts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import llguidance

from jaxserve.tokenizer.tokenizer import Tokenizer

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclass(frozen=True)
class TokenizerInfo:
  """What the structured-output code needs to know of a tokenizer (all ids in model space)."""

  vocab_size: int  # the model's vocabulary (mask width is ceil(vocab_size / 32))
  eos_token_ids: tuple[int, ...]
  from_tokenizer_json: bool  # False: built from the byte table (the fallback path)

  @property
  def bitmask_words(self) -> int:
    return (self.vocab_size + 31) // 32


@dataclass(frozen=True)
class _TokenTable:
  """The duck-typed "gtokenizer" llguidance.TokenizerWrapper reads (fallback path).

  Calling it tokenizes greedily (longest known piece first) over the non-special token bytes:
  llguidance calls it on grammar text (e.g. bytes a grammar forces next) and needs tokens that
  spell exactly those bytes; the tokenizer's own encode would not (a SentencePiece normalizer
  prepends a space).
  """

  eos_token_id: int
  bos_token_id: int | None
  tokens: tuple[bytes, ...]
  special_token_ids: tuple[int, ...]
  by_bytes: Mapping[bytes, int]
  max_piece_len: int

  def __call__(self, text: bytes | str) -> list[int]:
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    ids, i = [], 0
    while i < len(data):
      for length in range(min(self.max_piece_len, len(data) - i), 0, -1):
        token_id = self.by_bytes.get(data[i : i + length])
        if token_id is not None:
          ids.append(token_id)
          i += length
          break
      else:
        i += 1  # a byte no token spells cannot be generated either
    return ids


def build_llg_tokenizer(
  tokenizer: Tokenizer, model_vocab_size: int | None = None
) -> tuple[llguidance.LLTokenizer, TokenizerInfo]:
  """The LLTokenizer for `tokenizer` and a model of `model_vocab_size` rows (default: the
  tokenizer's).

  Raises ValueError if the tokenizer has no eos token or the model's vocabulary is smaller than
  the tokenizer's.
  """
  vocab_size = tokenizer.vocab_size if model_vocab_size is None else int(model_vocab_size)
  backend_size = tokenizer.backend.get_vocab_size(with_added_tokens=True)
  if vocab_size < backend_size:
    raise ValueError(
      f"model_vocab_size: {vocab_size} is smaller than the tokenizer's {backend_size} tokens"
    )
  eos = list(tokenizer.eos_token_ids)
  if not eos:
    raise ValueError("eos_token: structured outputs need a tokenizer with an eos token")
  try:
    llg_tok = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=eos)
    from_json = True
  except ValueError:
    table = _token_table(tokenizer, backend_size)
    llg_tok = llguidance.LLTokenizer(
      llguidance.TokenizerWrapper(table), n_vocab=vocab_size, eos_token=eos
    )
    from_json = False
  return llg_tok, TokenizerInfo(vocab_size, tuple(eos), from_json)


def _token_table(tokenizer: Tokenizer, backend_size: int) -> _TokenTable:
  special = set(tokenizer.all_special_ids)
  anchor = _anchor_id(tokenizer, special)
  tokens = tuple(_token_bytes(tokenizer, i, special, anchor) for i in range(backend_size))
  by_bytes: dict[bytes, int] = {}
  for token_id, piece in enumerate(tokens):
    if piece and token_id not in special:
      by_bytes.setdefault(piece, token_id)
  return _TokenTable(
    eos_token_id=tokenizer.eos_token_ids[0],
    bos_token_id=tokenizer.bos_token_id,
    tokens=tokens,
    special_token_ids=tuple(sorted(special)),
    by_bytes=by_bytes,
    max_piece_len=max(map(len, by_bytes), default=1),
  )


def _anchor_id(tokenizer: Tokenizer, special: set[int]) -> int:
  """A plain token that decodes to itself, so decode([anchor, id]) shows id's text in context."""
  ids = [i for i in tokenizer.encode("a", add_special_tokens=False) if i not in special]
  if not ids:
    raise ValueError("tokenizer: cannot find a plain token to decode vocabulary pieces against")
  return ids[-1]


def _token_bytes(tokenizer: Tokenizer, token_id: int, special: set[int], anchor: int) -> bytes:
  piece = tokenizer.id_to_token(token_id)
  if token_id in special:
    return piece.encode("utf-8")
  byte = _BYTE_PIECE.match(piece)
  if byte:
    return bytes([int(byte.group(1), 16)])
  prefix = tokenizer.decode([anchor], skip_special_tokens=False)
  both = tokenizer.decode([anchor, token_id], skip_special_tokens=False)
  text = both[len(prefix) :] if both.startswith(prefix) else tokenizer.decode([token_id], False)
  return text.encode("utf-8")


def token_ids_allowed(bitmask_row: Sequence[int], vocab_size: int) -> list[int]:
  """The ids whose bit is set in one int32 bitmask row (bit i % 32 of word i // 32); for tests
  and debugging."""
  return [i for i in range(vocab_size) if (int(bitmask_row[i // 32]) >> (i % 32)) & 1]
