"""Shared pieces of the structured-output tests: tokenizers, a random "model" and JSON checks."""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass

import numpy as np

from jaxserve.structured import (
  BitmaskFiller,
  GrammarCompiler,
  GrammarState,
  SequenceMatcher,
  StructuredOutputSpec,
  TokenizerInfo,
  build_llg_tokenizer,
)
from jaxserve.tokenizer import Tokenizer, byte_level_tokenizer
from jaxserve.tokenizer.tokenizer import load_tokenizer_dir
from tests.tokenizer import tokenizer_checkpoints as ckpt

BPE_MODEL_VOCAB = 640  # the trained Llama-3-style tokenizer has 574 tokens; the model pads to 640


@dataclass(frozen=True)
class Setup:
  tokenizer: Tokenizer
  info: TokenizerInfo
  compiler: GrammarCompiler
  filler: BitmaskFiller


@functools.cache
def llama3_bpe() -> Setup:
  """A real trained byte-level BPE tokenizer (Llama-3 layout), model vocab padded past it."""
  tokenizer = load_tokenizer_dir(ckpt.llama3_checkpoint(tempfile.mkdtemp(prefix="llg_llama3_")))
  return _setup(tokenizer, BPE_MODEL_VOCAB)


@functools.cache
def byte_tokenizer() -> Setup:
  """The tiny-random byte tokenizer (262 tokens in a 512-row vocabulary)."""
  return _setup(byte_level_tokenizer(), None)


@functools.cache
def sentencepiece_bpe() -> Setup:
  """A Llama-2-style tokenizer whose decoder llguidance cannot read (the byte-table path)."""
  directory = ckpt.sentencepiece_checkpoint(tempfile.mkdtemp(prefix="llg_sp_"))
  return _setup(load_tokenizer_dir(directory), None)


def _setup(tokenizer: Tokenizer, model_vocab: int | None) -> Setup:
  llg_tokenizer, info = build_llg_tokenizer(tokenizer, model_vocab)
  return Setup(tokenizer, info, GrammarCompiler(llg_tokenizer, info), BitmaskFiller(info, 2))


def allowed_ids(row: np.ndarray, vocab_size: int) -> np.ndarray:
  """Ids whose bit is set, unpacked with numpy (independent of the code under test)."""
  bits = np.unpackbits(np.ascontiguousarray(row, dtype="<i4").view(np.uint8), bitorder="little")
  return np.flatnonzero(bits[:vocab_size])


@dataclass(frozen=True)
class Walk:
  token_ids: tuple[int, ...]  # without the final eos
  ended_with_eos: bool
  state: GrammarState
  max_allowed_id: int


def random_walk(
  setup: Setup, spec: StructuredOutputSpec, rng: np.random.Generator, max_steps: int = 2000
) -> Walk:
  """A random model: each step samples uniformly among the ids the mask allows, until eos."""
  matcher = SequenceMatcher(setup.compiler.compile(spec), setup.info)
  bitmask = setup.filler.new_bitmask(1)
  tokens: list[int] = []
  max_allowed = -1
  for _ in range(max_steps):
    matcher.fill_bitmask(bitmask, 0)
    allowed = allowed_ids(bitmask[0], setup.info.vocab_size)
    max_allowed = max(max_allowed, int(allowed.max()))
    token = int(rng.choice(allowed))
    assert matcher.consume([token]), matcher.error
    if token in setup.info.eos_token_ids:
      return Walk(tuple(tokens), True, matcher.state, max_allowed)
    tokens.append(token)
  return Walk(tuple(tokens), False, matcher.state, max_allowed)


def whitespace_outside_strings(text: str) -> list[int]:
  """Positions of JSON whitespace outside string literals."""
  positions, in_string, escaped = [], False, False
  for i, char in enumerate(text):
    if in_string:
      if escaped:
        escaped = False
      elif char == "\\":
        escaped = True
      elif char == '"':
        in_string = False
    elif char == '"':
      in_string = True
    elif char in " \t\n\r":
      positions.append(i)
  return positions
