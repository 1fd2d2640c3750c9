"""Tokenizers (tokenizer.json, the tiny-random byte tokenizer), chat templates, streaming text."""

from __future__ import annotations

from jaxserve.tokenizer.byte_tokenizer import byte_level_tokenizer
from jaxserve.tokenizer.chat_template import compile_chat_template, render_chat_template
from jaxserve.tokenizer.detokenizer import DetokenizerDelta, IncrementalDetokenizer
from jaxserve.tokenizer.tokenizer import SpecialTokens, Tokenizer, load_tokenizer

__all__ = [
  "DetokenizerDelta",
  "IncrementalDetokenizer",
  "SpecialTokens",
  "Tokenizer",
  "byte_level_tokenizer",
  "compile_chat_template",
  "load_tokenizer",
  "render_chat_template",
]
