"""A word-level tokenizer that covers a whole vocabulary, for random-weight checkpoints.

A random-weight model samples ids uniformly over its vocabulary. With the byte tokenizer almost
every id of a 128k vocabulary decodes to "", so a server would stream (and a benchmark time) almost
nothing (docs/DECISIONS.md, "A word-level tokenizer for random-weight checkpoints"). Here every id
that is not special is a distinct visible word: "system", "user" and "assistant" (so the chat
template's roles are words), then the letter codes a, b, ..., z, aa, ab, ... in order. Text is words
separated by whitespace (a `tokenizers` WordLevel model behind a WhitespaceSplit pre-tokenizer;
decoding joins tokens with one space), so:

* every non-special id decodes, alone, to a non-empty printable word, and a generated token
  streams as " word";
* decode(encode(text)) == text for text of vocabulary words separated by single spaces, and
  encode(decode(ids)) == ids for any ids that are not special (bos is added by encode);
* other words encode to <unk> (id 0), which decodes to the visible "<unk>".

bos and eos are special tokens at the ids the model config names.
"""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Iterator, Sequence
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, models, pre_tokenizers, processors

UNK_TOKEN = "<unk>"
UNK_ID = 0
BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
ROLE_WORDS = ("system", "user", "assistant")
CHAT_TEMPLATE = (
  "{{ bos_token }}"
  "{% for message in messages %}{{ message['role'] + ' ' + message['content'] + ' ' }}"
  "{% endfor %}"
  "{% if add_generation_prompt %}{{ 'assistant' }}{% endif %}"
)


def letter_codes() -> Iterator[str]:
  """a, b, ..., z, aa, ab, ..., zz, aaa, ... (bijective base 26)."""
  for length in itertools.count(1):
    for letters in itertools.product(string.ascii_lowercase, repeat=length):
      yield "".join(letters)


def vocab_words(vocab_size: int, bos_id: int, eos_ids: Sequence[int]) -> dict[str, int]:
  """token -> id for every id in [0, vocab_size): <unk>, bos, eos, then words."""
  special = {UNK_ID: UNK_TOKEN, bos_id: BOS_TOKEN}
  for k, eos_id in enumerate(eos_ids):
    special[eos_id] = EOS_TOKEN if k == 0 else f"<|end_of_text_{k}|>"
  if len(special) != 2 + len(eos_ids) or not all(0 <= i < vocab_size for i in special):
    raise ValueError(
      f"vocab_size: ids 0 (<unk>), bos {bos_id} and eos {list(eos_ids)} must be "
      f"distinct and below {vocab_size}"
    )
  codes = (c for c in letter_codes() if c not in ROLE_WORDS)
  words = itertools.chain(ROLE_WORDS, codes)
  return {special.get(i) or next(words): i for i in range(vocab_size)}


def build_vocab_tokenizer(
  vocab_size: int, bos_id: int, eos_ids: Sequence[int]
) -> tokenizers.Tokenizer:
  """The `tokenizers` backend (see the module docstring); encode adds bos."""
  vocab = vocab_words(vocab_size, bos_id, eos_ids)
  backend = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
  backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  specials = [token for token in vocab if token.startswith("<|")]
  backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
  backend.post_processor = processors.TemplateProcessing(
    single=f"{BOS_TOKEN}:0 $A:0",
    pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
    special_tokens=[(BOS_TOKEN, bos_id)],
  )
  return backend


def write_vocab_tokenizer(
  out_dir: str | Path, vocab_size: int, bos_id: int, eos_ids: Sequence[int]
) -> None:
  """tokenizer.json and tokenizer_config.json (with the chat template) into out_dir."""
  out_dir = Path(out_dir)
  build_vocab_tokenizer(vocab_size, bos_id, eos_ids).save(str(out_dir / "tokenizer.json"))
  (out_dir / "tokenizer_config.json").write_text(
    json.dumps(
      {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": UNK_TOKEN,
        "add_bos_token": True,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
      },
      indent=2,
    )
  )
