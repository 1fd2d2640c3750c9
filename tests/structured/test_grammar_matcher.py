"""GrammarCompiler (validation, cache) and SequenceMatcher / BitmaskFiller (masks, rollback, dead
ends) with real tokenizers and real llguidance."""

from __future__ import annotations

import numpy as np
import pytest

from jaxserve.structured import (
  BitmaskFiller,
  GrammarCompiler,
  GrammarState,
  SequenceMatcher,
  StructuredOutputError,
  StructuredOutputSpec,
  WhitespacePolicy,
  build_llg_tokenizer,
)
from jaxserve.tokenizer import byte_level_tokenizer
from tests.structured.helpers import (
  allowed_ids,
  byte_tokenizer,
  llama3_bpe,
  random_walk,
  sentencepiece_bpe,
)

BYTE_EOS = 257


@pytest.mark.parametrize(
  "spec",
  [
    StructuredOutputSpec.json_schema({"type": "wat"}, param="response_format.json_schema.schema"),
    StructuredOutputSpec.json_schema(
      {"type": "string", "pattern": "a("}, param="structured_outputs.json"
    ),
    StructuredOutputSpec.json_schema(
      {"type": "string", "format": "no-such-format"}, param="structured_outputs.json"
    ),
    StructuredOutputSpec.regex("a(", param="structured_outputs.regex"),
    StructuredOutputSpec.regex("[a&&b]", param="structured_outputs.regex"),  # matches nothing
    StructuredOutputSpec.grammar("start: undefined_rule", param="structured_outputs.grammar"),
    StructuredOutputSpec.grammar("root ::= [", param="structured_outputs.grammar"),
  ],
  ids=lambda s: s.param,
)
def test_invalid_constraints_raise_naming_the_field(spec):
  compiler = byte_tokenizer().compiler
  with pytest.raises(StructuredOutputError) as err:
    compiler.validate(spec)
  assert err.value.param == spec.param
  assert str(err.value).startswith(spec.param + ": invalid ")
  assert "<state>" not in str(err.value)


def test_cache_hits_and_lru_eviction():
  llg_tokenizer, info = build_llg_tokenizer(byte_level_tokenizer())
  compiler = GrammarCompiler(llg_tokenizer, info, cache_size=2)
  a = StructuredOutputSpec.json_schema(
    {"type": "integer"}, param="response_format.json_schema.schema"
  )
  a_again = StructuredOutputSpec.json_schema({"type": "integer"}, param="structured_outputs.json")
  b = StructuredOutputSpec.regex("[0-9]+")
  c = StructuredOutputSpec.choice(["x"])
  compiler.compile(a)
  compiler.compile(a_again)
  assert (compiler.stats().hits, compiler.stats().misses) == (1, 1)
  compiler.compile(
    StructuredOutputSpec.json_schema({"type": "integer"}, whitespace=WhitespacePolicy.SPACED)
  )
  assert compiler.stats().misses == 2
  compiler.compile(b)
  compiler.compile(c)  # evicts the least recently used: a
  assert compiler.stats().size == 2
  compiler.compile(a)
  assert (compiler.stats().hits, compiler.stats().misses) == (1, 5)


def test_compiled_matchers_are_independent():
  setup = byte_tokenizer()
  spec = StructuredOutputSpec.choice(["ab", "cd"])
  first = SequenceMatcher(setup.compiler.compile(spec), setup.info)
  second = SequenceMatcher(setup.compiler.compile(spec), setup.info)
  assert first.consume([ord("a")])
  bitmask = setup.filler.new_bitmask(2)
  first.fill_bitmask(bitmask, 0)
  second.fill_bitmask(bitmask, 1)
  assert allowed_ids(bitmask[0], 512).tolist() == [ord("b")]
  assert allowed_ids(bitmask[1], 512).tolist() == [ord("a"), ord("c")]


def test_padded_vocab_and_special_tokens_are_never_allowed():
  setup = llama3_bpe()
  backend_size = setup.tokenizer.backend.get_vocab_size(with_added_tokens=True)
  assert setup.info.vocab_size == 640 and setup.info.bitmask_words == 20
  spec = StructuredOutputSpec.regex("[a-z ]{0,40}")
  walk = random_walk(setup, spec, np.random.default_rng(0))
  assert walk.max_allowed_id < backend_size
  matcher = SequenceMatcher(setup.compiler.compile(spec), setup.info)
  bitmask = setup.filler.new_bitmask(1)
  matcher.fill_bitmask(bitmask, 0)
  allowed = set(allowed_ids(bitmask[0], 640).tolist())
  special = set(setup.tokenizer.all_special_ids) - set(setup.info.eos_token_ids)
  assert allowed and not allowed & special
  assert set(setup.info.eos_token_ids) <= allowed  # "" matches: eos may end it at once


def test_sentencepiece_tokenizer_uses_the_byte_table():
  setup = sentencepiece_bpe()
  assert not setup.info.from_tokenizer_json
  spec = StructuredOutputSpec.choice(["Hello world", "lazy dog"])
  rng = np.random.default_rng(3)
  outputs = {setup.tokenizer.decode(random_walk(setup, spec, rng).token_ids) for _ in range(12)}
  assert outputs == {"Hello world", "lazy dog"}


def test_states_and_finished_only_allows_eos():
  setup = byte_tokenizer()
  matcher = SequenceMatcher(
    setup.compiler.compile(StructuredOutputSpec.choice(["yes"])), setup.info
  )
  assert matcher.state is GrammarState.ACTIVE and not matcher.is_accepting()
  assert matcher.consume(list(b"yes"))
  assert matcher.state is GrammarState.FINISHED and matcher.is_accepting()
  bitmask = setup.filler.new_bitmask(1)
  matcher.fill_bitmask(bitmask, 0)
  assert allowed_ids(bitmask[0], 512).tolist() == [BYTE_EOS]


def test_dead_end_is_reported_and_masks_only_eos():
  setup = byte_tokenizer()
  matcher = SequenceMatcher(
    setup.compiler.compile(StructuredOutputSpec.regex("[0-9]+")), setup.info
  )
  other = SequenceMatcher(setup.compiler.compile(StructuredOutputSpec.regex("[0-9]+")), setup.info)
  assert matcher.consume([ord("7")])
  assert not matcher.consume([ord("x")])  # a token outside the mask (e.g. a stale mask)
  assert matcher.state is GrammarState.DEAD_END and matcher.error
  report = setup.filler.fill([(other, 0), (matcher, 2)], num_rows=3)
  assert report.dead_end_rows == (2,)
  assert allowed_ids(report.bitmask[2], 512).tolist() == [BYTE_EOS]
  assert allowed_ids(report.bitmask[0], 512).tolist() == list(range(ord("0"), ord("9") + 1))
  with pytest.raises(ValueError, match="dead end"):
    matcher.rollback(1)
  rebuilt = SequenceMatcher(
    setup.compiler.compile(StructuredOutputSpec.regex("[0-9]+")), setup.info
  )
  assert rebuilt.consume([ord("7")]) and rebuilt.state is GrammarState.ACTIVE


def test_rollback_restores_earlier_masks():
  setup = llama3_bpe()
  schema = {
    "type": "object",
    "additionalProperties": False,
    "required": ["k", "v"],
    "properties": {
      "k": {"type": "string", "maxLength": 6},
      "v": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    },
  }
  spec = StructuredOutputSpec.json_schema(schema)
  walk = random_walk(setup, spec, np.random.default_rng(7))
  tokens = list(walk.token_ids)
  assert len(tokens) >= 6
  matcher = SequenceMatcher(setup.compiler.compile(spec), setup.info)
  bitmask = setup.filler.new_bitmask(1)
  masks = []
  for token in tokens:
    matcher.fill_bitmask(bitmask, 0)
    masks.append(bitmask[0].copy())
    assert matcher.consume([token])
  for back in (1, 3, len(tokens)):
    matcher.rollback(back)
    assert matcher.num_tokens == len(tokens) - back
    matcher.fill_bitmask(bitmask, 0)
    np.testing.assert_array_equal(bitmask[0], masks[len(tokens) - back])
    assert matcher.consume(tokens[len(tokens) - back :])
  assert matcher.consume([setup.info.eos_token_ids[0]]) and matcher.state is GrammarState.FINISHED
  with pytest.raises(ValueError, match="num_tokens"):
    matcher.rollback(len(tokens) + 2)
  assert matcher.state is GrammarState.FINISHED  # a refused rollback leaves the matcher as it was
  matcher.rollback(1)  # the eos; the closing brace had already completed (stopped) the grammar
  assert matcher.state is GrammarState.FINISHED and matcher.num_tokens == len(tokens)
  matcher.rollback(1)
  matcher.fill_bitmask(bitmask, 0)
  np.testing.assert_array_equal(bitmask[0], masks[-1])


@pytest.mark.parametrize(
  "pattern, text, state_before_eos",
  [
    ("ab", b"ab", GrammarState.FINISHED),  # complete: nothing but eos can follow
    ("a+", b"aa", GrammarState.ACTIVE),  # accepting, but more a's may follow
  ],
)
def test_rollback_of_eos(pattern, text, state_before_eos):
  setup = byte_tokenizer()
  matcher = SequenceMatcher(setup.compiler.compile(StructuredOutputSpec.regex(pattern)), setup.info)
  assert matcher.consume(list(text)) and matcher.state is state_before_eos
  bitmask = setup.filler.new_bitmask(1)
  matcher.fill_bitmask(bitmask, 0)
  before_eos = bitmask[0].copy()
  assert matcher.consume([BYTE_EOS]) and matcher.state is GrammarState.FINISHED
  matcher.rollback(1)
  assert matcher.state is state_before_eos and matcher.num_tokens == len(text)
  matcher.fill_bitmask(bitmask, 0)
  np.testing.assert_array_equal(bitmask[0], before_eos)
  matcher.rollback(1)
  matcher.fill_bitmask(bitmask, 0)
  expected = [ord("b")] if pattern == "ab" else [ord("a"), BYTE_EOS]
  assert allowed_ids(bitmask[0], 512).tolist() == expected


def test_batch_fill_matches_single_fills_and_leaves_other_rows_unconstrained():
  setup = llama3_bpe()
  specs = [
    StructuredOutputSpec.regex("[0-9]{2,4}"),
    StructuredOutputSpec.json_object(),
    StructuredOutputSpec.choice(["lazy dog", "quick fox"]),
    StructuredOutputSpec.json_schema({"type": "array", "items": {"type": "boolean"}}),
  ]
  matchers = [SequenceMatcher(setup.compiler.compile(s), setup.info) for s in specs]
  assert matchers[1].consume(setup.tokenizer.encode('{"a', add_special_tokens=False))
  rows = [(matchers[0], 5), (matchers[1], 0), (matchers[2], 2), (matchers[3], 6)]
  out = np.zeros((7, setup.info.bitmask_words), np.int32)
  report = setup.filler.fill(rows, num_rows=7, out=out)
  assert report.bitmask is out and report.seconds > 0 and report.dead_end_rows == ()
  single = setup.filler.new_bitmask(1)
  for matcher, row in rows:
    matcher.fill_bitmask(single, 0)
    np.testing.assert_array_equal(out[row], single[0])
    assert 0 < len(allowed_ids(out[row], 640)) < 574
  for row in (1, 3, 4):
    assert (out[row] == -1).all()
  with pytest.raises(ValueError, match="rows"):
    setup.filler.fill([(matchers[0], 1), (matchers[1], 1)], num_rows=3)
  with pytest.raises(ValueError, match="rows"):
    setup.filler.fill([(matchers[0], 3)], num_rows=3)
  with pytest.raises(ValueError, match="out"):
    setup.filler.fill([], num_rows=3, out=np.zeros((3, 7), np.int32))


def test_parallel_consume():
  setup = byte_tokenizer()
  filler = BitmaskFiller(setup.info, num_threads=2)
  spec = StructuredOutputSpec.regex("[a-c]+")
  matchers = [SequenceMatcher(setup.compiler.compile(spec), setup.info) for _ in range(3)]
  assert filler.consume(
    [(matchers[0], ord("a")), (matchers[1], ord("z")), (matchers[2], ord("c"))]
  ) == [True, False, True]
  assert [m.num_tokens for m in matchers] == [1, 0, 1]
  assert [m.state for m in matchers] == [
    GrammarState.ACTIVE,
    GrammarState.DEAD_END,
    GrammarState.ACTIVE,
  ]


def test_fill_checks_the_buffer():
  setup = byte_tokenizer()
  matcher = SequenceMatcher(setup.compiler.compile(StructuredOutputSpec.regex("a")), setup.info)
  with pytest.raises(ValueError, match="words"):
    matcher.fill_bitmask(np.zeros((1, 17), np.int32), 0)
  with pytest.raises(ValueError, match="int32"):
    matcher.fill_bitmask(np.zeros((1, 16), np.int64), 0)
