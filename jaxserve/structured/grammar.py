"""Compiling a `StructuredOutputSpec` into an llguidance grammar, validated, cached per spec.

llguidance (the grammar engine of vLLM's "guidance" backend) is Rust behind a small Python API
with no torch dependency: it computes a token mask straight into a numpy int32 bitmask (one bit
per token), fills many sequences' rows in parallel threads with the GIL released (LLExecutor),
takes JSON schema, regex, Lark and GBNF, keeps matcher state incrementally with rollback, and
compiles lazily (docs/DECISIONS.md, "llguidance for structured outputs").

Compilation = building an `LLMatcher` for the spec (llguidance checks the grammar against the
tokenizer there) and computing its first mask (which catches a grammar that matches nothing). A
spec that does not compile raises `StructuredOutputError` naming its field, before the request
reaches the scheduler, so no KV page is ever allocated for it. The compiled matcher is a
template: each sequence gets a `deep_copy()` of it.

JSON whitespace follows the spec's `WhitespacePolicy`; the default is compact (no whitespace
outside strings), overriding any "x-guidance" options inside the user's schema.

`GrammarCompiler` owns the LRU cache (no module-level state); it is thread-safe, so threads may
share one.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from jaxserve.structured.llg_tokenizer import TokenizerInfo
from jaxserve.structured.spec import (
  ConstraintKind,
  StructuredOutputError,
  StructuredOutputSpec,
  WhitespacePolicy,
)

DEFAULT_CACHE_SIZE = 256
_JSON_OPTIONS = {
  WhitespacePolicy.COMPACT: {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
  },
  WhitespacePolicy.SPACED: {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
  },
  WhitespacePolicy.FLEXIBLE: {"whitespace_flexible": True},
}


@dataclass(frozen=True)
class CacheStats:
  hits: int
  misses: int
  size: int


def json_options(whitespace: WhitespacePolicy) -> dict[str, bool | str]:
  """llguidance's JSON options ("x-guidance") for `whitespace`."""
  return dict(_JSON_OPTIONS[whitespace])


def grammar_text(spec: StructuredOutputSpec) -> str:
  """The llguidance grammar (its JSON form) for `spec`, not yet validated."""
  if spec.kind in (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT):
    options = json_options(spec.whitespace)
    try:
      return llguidance.LLMatcher.grammar_from_json_schema(spec.schema(), overrides=options)
    except ValueError as e:
      raise StructuredOutputError(spec.param, f"invalid JSON schema: {e}") from e
  if spec.kind is ConstraintKind.REGEX:
    return llguidance.LLMatcher.grammar_from_regex(spec.source)
  if spec.kind is ConstraintKind.CHOICE:
    return llguidance.grammar_from("choice", list(spec.choices))
  try:
    return llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec.source))
  except Exception as e:  # noqa: BLE001 - the GBNF converter raises bare Exceptions on bad input
    raise StructuredOutputError(spec.param, f"invalid grammar: {e}") from e


class GrammarCompiler:
  """Compiles specs for one tokenizer; `compile` returns a fresh matcher for one sequence."""

  def __init__(
    self,
    llg_tokenizer: llguidance.LLTokenizer,
    info: TokenizerInfo,
    cache_size: int = DEFAULT_CACHE_SIZE,
  ) -> None:
    if cache_size < 1:
      raise ValueError(f"cache_size: must be >= 1, got {cache_size}")
    self.info = info
    self._tokenizer = llg_tokenizer
    self._cache_size = cache_size
    self._cache: collections.OrderedDict[StructuredOutputSpec, llguidance.LLMatcher] = (
      collections.OrderedDict()
    )
    self._lock = threading.Lock()
    self._hits = 0
    self._misses = 0

  def validate(self, spec: StructuredOutputSpec) -> None:
    """Raises StructuredOutputError naming the field if `spec` does not compile (and caches it)."""
    self._template(spec)

  def compile(self, spec: StructuredOutputSpec) -> llguidance.LLMatcher:
    """A new matcher in its initial state (a copy of the cached template)."""
    return self._template(spec).deep_copy()

  def stats(self) -> CacheStats:
    with self._lock:
      return CacheStats(self._hits, self._misses, len(self._cache))

  def _template(self, spec: StructuredOutputSpec) -> llguidance.LLMatcher:
    with self._lock:
      template = self._cache.get(spec)
      if template is not None:
        self._cache.move_to_end(spec)
        self._hits += 1
        return template
      self._misses += 1
    template = self._build(spec)
    with self._lock:
      self._cache[spec] = template
      self._cache.move_to_end(spec)
      while len(self._cache) > self._cache_size:
        self._cache.popitem(last=False)
    return template

  def _build(self, spec: StructuredOutputSpec) -> llguidance.LLMatcher:
    grammar = grammar_text(spec)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
      grammar, self._tokenizer
    )
    if is_error:
      raise StructuredOutputError(spec.param, f"invalid {spec.kind.value}: {messages[0]}")
    matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
    if not matcher.is_error():
      matcher.compute_bitmask()  # the first mask: a grammar that matches nothing fails here
    if matcher.is_error():
      raise StructuredOutputError(
        spec.param, f"invalid {spec.kind.value}: {_short_error(matcher.get_error())}"
      )
    return matcher


def _short_error(message: str) -> str:
  """llguidance's error without the parser-state dump it appends (for the client's 400 body)."""
  head = message.split("<state>", 1)[0].strip()
  if head in ("NoExtension", "NoExtensionBias"):
    return "it matches no output (no token can start it)"
  return head
