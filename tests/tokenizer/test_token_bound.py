"""The bytes one token can stand for (tokenizer/token_bound.py), against what the tokenizers library
encodes: where a bound is proven, no text encodes to fewer tokens than its byte length allows
(the worst texts, made of the longest tokens, reach it exactly); where none is, a text shows why."""

from __future__ import annotations

import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, models, normalizers, pre_tokenizers

from jaxserve.bench.vocab_tokenizer import build_vocab_tokenizer
from jaxserve.tokenizer.byte_tokenizer import _byte_backend, byte_level_tokenizer
from jaxserve.tokenizer.token_bound import max_bytes_per_token
from jaxserve.tokenizer.tokenizer import Tokenizer
from tests.tokenizer import tokenizer_checkpoints as ckpt

BYTE = byte_level_tokenizer()
LLAMA3 = Tokenizer(ckpt.byte_level_bpe(ckpt.LLAMA3_SPECIALS, bos_token="<|begin_of_text|>"))
QWEN = Tokenizer(ckpt.byte_level_bpe(ckpt.CHATML_SPECIALS, bos_token=None))


def _longest(tokenizer: Tokenizer) -> list[str]:
  """The tokens whose text is longest: the ten longest vocabulary entries, as the text they
  match (ByteLevel's characters decoded), and the added tokens."""
  backend = tokenizer.backend
  vocab = sorted(backend.get_vocab(with_added_tokens=False), key=len, reverse=True)[:10]
  decoded = [backend.decode([backend.token_to_id(token)]) for token in vocab]
  return decoded + [t.content for t in backend.get_added_tokens_decoder().values()]


def test_the_byte_tokenizer_s_bound_is_its_longest_special_token():
  assert BYTE.max_bytes_per_token == len("<|assistant|>") == 13
  text = "<|assistant|>" * 50  # 650 bytes, 50 tokens and bos: the bound is reached exactly
  assert len(BYTE.encode(text)) == BYTE.min_num_tokens(text) == 51
  assert len(BYTE.encode(text, add_special_tokens=False)) == 50
  assert BYTE.min_num_tokens(text, add_special_tokens=False) == 50


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_no_text_encodes_to_fewer_tokens_than_its_bytes_prove(data):
  for tokenizer in (BYTE, LLAMA3, QWEN):
    assert tokenizer.max_bytes_per_token is not None
    pieces = _longest(tokenizer) + [" ", "  ", "\n", "é", "日本", "🤖", "a", "The", " quick"]
    text = "".join(data.draw(st.lists(st.sampled_from(pieces), max_size=40)))
    text += data.draw(st.text(max_size=20))
    for add_special_tokens in (True, False):
      bound = tokenizer.min_num_tokens(text, add_special_tokens)
      assert len(tokenizer.encode(text, add_special_tokens)) >= bound, (text, bound)


def _backend(
  model: models.Model,
  normalizer: normalizers.Normalizer | None = None,
  pre_tokenizer: pre_tokenizers.PreTokenizer | None = None,
) -> tokenizers.Tokenizer:
  backend = tokenizers.Tokenizer(model)
  if normalizer is not None:
    backend.normalizer = normalizer
  if pre_tokenizer is not None:
    backend.pre_tokenizer = pre_tokenizer
  return backend


ABC = {"a": 0, "b": 1, "c": 2, "<unk>": 3}


def test_no_bound_where_a_text_of_many_bytes_can_be_one_token():
  """Each case: the tokenizer, and a text of many bytes that encodes to very few tokens."""
  cases = []
  stripping = _byte_backend()  # a normalizer may delete text
  stripping.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Strip()])
  cases.append((stripping, " " * 300 + "a"))
  whitespace = _backend(models.BPE(ABC, []), pre_tokenizer=pre_tokenizers.Whitespace())
  cases.append((whitespace, "a" + " " * 300 + "b"))  # the spaces are dropped
  removed = _backend(
    models.BPE(ABC, []), pre_tokenizer=pre_tokenizers.Split(" ", behavior="removed")
  )
  cases.append((removed, "a" + " " * 300))
  fused = _backend(models.BPE(ABC, [], unk_token="<unk>", fuse_unk=True))
  cases.append((fused, "x" * 300))  # one <unk>
  word_level = build_vocab_tokenizer(512, bos_id=256, eos_ids=[257])
  cases.append((word_level, "zzzzzzzzzzzz" * 25))  # one <unk>, and bos
  swallowing = _byte_backend()
  swallowing.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True)])
  cases.append((swallowing, " " * 300 + "<mask>"))  # the spaces go with <mask>
  for backend, text in cases:
    assert max_bytes_per_token(backend) is None, backend.to_str()[:200]
    assert len(backend.encode(text, add_special_tokens=False).ids) <= 2
    assert Tokenizer(backend).min_num_tokens(text) is None


def test_a_bound_where_every_piece_of_text_stays():
  unfused = _backend(models.BPE(ABC, [], unk_token="<unk>", fuse_unk=False))
  assert max_bytes_per_token(unfused) == 5  # "<unk>" itself; an unknown character <= 4 bytes
  assert len(unfused.encode("🤖🤖🤖").ids) == 3
  metaspace = _backend(
    models.BPE({"▁": 0, "a": 1, "▁a": 2}, [("▁", "a")]), pre_tokenizer=pre_tokenizers.Metaspace()
  )
  assert max_bytes_per_token(metaspace) == 4  # "▁a": 3 + 1 bytes for " a"'s 2
  split = pre_tokenizers.Sequence(
    [pre_tokenizers.Split(" ", behavior="isolated"), pre_tokenizers.Digits()]
  )
  assert max_bytes_per_token(_backend(models.BPE(ABC, []), pre_tokenizer=split)) == 5
  truncating = _byte_backend()
  truncating.enable_truncation(8)
  assert max_bytes_per_token(truncating) is None  # encode would return 8 tokens of anything
