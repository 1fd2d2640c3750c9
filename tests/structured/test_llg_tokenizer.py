"""build_llg_tokenizer: vocabulary padding, eos, and the byte-table path's tokenization."""

from __future__ import annotations

import pytest
import tokenizers
from tokenizers import models

from jaxserve.structured import build_llg_tokenizer
from jaxserve.tokenizer import Tokenizer, byte_level_tokenizer
from tests.structured.helpers import llama3_bpe, sentencepiece_bpe


def test_mask_width_follows_the_model_vocabulary():
  setup = llama3_bpe()
  assert setup.info.from_tokenizer_json
  assert setup.info.vocab_size == 640 and setup.info.bitmask_words == 20
  assert (
    setup.info.eos_token_ids == setup.tokenizer.eos_token_ids and len(setup.info.eos_token_ids) == 2
  )
  llg_tokenizer, info = build_llg_tokenizer(byte_level_tokenizer())
  assert (info.vocab_size, llg_tokenizer.vocab_size, info.eos_token_ids) == (512, 512, (257,))


def test_model_vocabulary_smaller_than_the_tokenizer_is_an_error():
  with pytest.raises(ValueError, match="model_vocab_size"):
    build_llg_tokenizer(llama3_bpe().tokenizer, 100)


def test_tokenizer_without_eos_is_an_error():
  backend = tokenizers.Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
  with pytest.raises(ValueError, match="eos_token"):
    build_llg_tokenizer(Tokenizer(backend))


def test_byte_table_tokens_spell_their_text():
  setup = sentencepiece_bpe()
  llg_tokenizer, _ = build_llg_tokenizer(setup.tokenizer)
  for text in ("lazy dog", " Hello, world!", "café naïve"):
    ids = llg_tokenizer.tokenize_str(text)
    assert llg_tokenizer.decode_str(ids) == text  # no SentencePiece dummy-prefix space added
  # pieces carry the space their "▁" stands for, as the tokenizer decodes them in context
  piece_id = setup.tokenizer.backend.token_to_id("▁the▁")
  assert llg_tokenizer.decode_bytes([piece_id]) == b" the "
