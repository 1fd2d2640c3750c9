"""The most bytes of text that one token of a tokenizer can stand for, where it can be proven.

With such a bound M, a text of B bytes (UTF-8) encodes to at least ceil(B / M) tokens, so a
prompt whose byte length alone proves it too long for the context is refused before it is
tokenized (server/prompt_length.py). Only a lower bound on the token count can refuse a prompt;
"a byte is at most one token" bounds the count from above (and only holds where no token is the
empty string), which proves that a prompt fits, never that it does not.

A token stands for the text it was matched on, after the normalizer and the pre-tokenizer have
rewritten it. The bound is the longest of the strings that can match, in UTF-8 bytes, and it
holds only where nothing shrinks or drops text on the way:

* no normalizer (NFC composes a base and its combining marks, NFKC folds full-width letters,
  Strip and Replace delete: text of B bytes may normalize to far fewer) and no truncation;
* a pre-tokenizer that keeps every byte: none, ByteLevel (each byte becomes one character, so
  its 1- or 2-byte character counts at least the byte it stands for), Metaspace (a space
  becomes the 3-byte "▁"), Digits, UnicodeScripts, Split and Punctuation unless their behavior
  is "Removed", and Sequences of these (Whitespace, WhitespaceSplit, BertPreTokenizer and
  CharDelimiterSplit drop the whitespace or the delimiter they split on);
* a BPE model (its tokens are vocabulary strings, an affix such as "##" or "</w>" only making
  them longer than the text they match, a byte-fallback "<0x0A>" longer than its byte) whose
  unknown text, if any, becomes one unknown token per character (at most 4 bytes): not with
  fuse_unk, which makes any run of unknown characters one token. WordPiece's and WordLevel's
  unknown token stands for a whole word, Unigram's for a fused run: no bound;
* added tokens matched as they are written: one with lstrip or rstrip also swallows the
  whitespace around it, however long.

Anything else (another component, a setting not recognized) has no bound: its prompts are
tokenized in full, as they always were.
"""

from __future__ import annotations

import json

import tokenizers
from tokenizers import models

MAX_UTF8_CHAR_BYTES = 4
_KEEPING_PRE_TOKENIZERS = frozenset(
  ("ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split", "Punctuation")
)


def max_bytes_per_token(backend: tokenizers.Tokenizer) -> int | None:
  """The most UTF-8 bytes of input one token of `backend` can stand for; None where no bound
  holds (see the module docstring)."""
  if backend.normalizer is not None or backend.truncation is not None:
    return None
  if backend.pre_tokenizer is not None:
    if not _keeps_every_byte(json.loads(backend.pre_tokenizer.__getstate__())):
      return None
  model = backend.model
  if not isinstance(model, models.BPE):
    return None
  longest = max(
    (_utf8_len(token) for token in backend.get_vocab(with_added_tokens=False)), default=0
  )
  if model.unk_token is not None and not _all_bytes_fall_back(backend, model):
    if model.fuse_unk:
      return None
    longest = max(longest, MAX_UTF8_CHAR_BYTES)
  for added in backend.get_added_tokens_decoder().values():
    if added.lstrip or added.rstrip:
      return None
    longest = max(longest, _utf8_len(added.content))
  return longest or None


def _keeps_every_byte(spec: dict) -> bool:
  kind = spec.get("type")
  if kind == "Sequence":
    return all(_keeps_every_byte(inner) for inner in spec.get("pretokenizers", ()))
  if kind not in _KEEPING_PRE_TOKENIZERS:
    return False
  return spec.get("behavior") != "Removed"


def _all_bytes_fall_back(backend: tokenizers.Tokenizer, model: models.BPE) -> bool:
  """Byte fallback with every byte's token: unknown text becomes bytes, never the unknown
  token."""
  return bool(model.byte_fallback) and all(
    backend.token_to_id(f"<0x{b:02X}>") is not None for b in range(256)
  )


def _utf8_len(text: str) -> int:
  return len(text.encode("utf-8", "surrogatepass"))
