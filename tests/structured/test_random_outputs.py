"""A random "model" (uniform among the allowed ids) under each constraint: every output is valid.

Outputs are decoded with the real tokenizer and checked with jsonschema / Python's re, not with
llguidance, so a wrong mask or a wrong token table fails here.
"""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from jaxserve.structured import GrammarState, StructuredOutputSpec, WhitespacePolicy
from tests.structured.helpers import (
  byte_tokenizer,
  llama3_bpe,
  random_walk,
  whitespace_outside_strings,
)

SETUPS = {"llama3_bpe": llama3_bpe, "byte": byte_tokenizer}
NUM_SAMPLES = 12

PERSON = {
  "type": "object",
  "additionalProperties": False,
  "required": ["id", "name", "status", "address", "tags"],
  "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 99999},
    "name": {"type": "string", "minLength": 1, "maxLength": 10},
    "status": {"enum": ["active", "inactive", "banned"]},
    "score": {"type": "number"},
    "verified": {"type": "boolean"},
    "address": {
      "type": "object",
      "additionalProperties": False,
      "required": ["city"],
      "properties": {
        "city": {"type": "string", "maxLength": 8},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
      },
    },
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 4},
  },
}
NESTED_ARRAYS = {
  "type": "array",
  "minItems": 1,
  "maxItems": 3,
  "items": {
    "type": "object",
    "additionalProperties": False,
    "required": ["kind", "points"],
    "properties": {
      "kind": {"const": "polyline"},
      "points": {
        "type": "array",
        "maxItems": 3,
        "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer"}},
      },
      "label": {"anyOf": [{"type": "null"}, {"enum": ["a", "b"]}]},
    },
  },
}
PYDANTIC_STYLE = {  # what openai's client.chat.completions.parse sends for a pydantic model
  "$defs": {
    "Step": {
      "additionalProperties": False,
      "properties": {
        "explanation": {"maxLength": 8, "title": "Explanation", "type": "string"},
        "output": {"maxLength": 8, "title": "Output", "type": "string"},
      },
      "required": ["explanation", "output"],
      "title": "Step",
      "type": "object",
    }
  },
  "additionalProperties": False,
  "properties": {
    "steps": {"items": {"$ref": "#/$defs/Step"}, "maxItems": 3, "title": "Steps", "type": "array"},
    "final_answer": {"enum": ["yes", "no"], "title": "Final Answer"},
  },
  "required": ["steps", "final_answer"],
  "title": "Answer",
  "type": "object",
}


def _outputs(setup, spec, seed, num=NUM_SAMPLES, max_steps=2000):
  rng = np.random.default_rng(seed)
  walks = [random_walk(setup, spec, rng, max_steps) for _ in range(num)]
  assert all(w.ended_with_eos and w.state is GrammarState.FINISHED for w in walks)
  return [setup.tokenizer.decode(w.token_ids) for w in walks]


@pytest.mark.parametrize("setup_name", SETUPS)
@pytest.mark.parametrize(
  "schema", [PERSON, NESTED_ARRAYS, PYDANTIC_STYLE], ids=["person", "nested_arrays", "pydantic"]
)
def test_json_schema_outputs_validate_and_are_compact(setup_name, schema):
  setup = SETUPS[setup_name]()
  for text in _outputs(setup, StructuredOutputSpec.json_schema(schema), seed=len(setup_name)):
    jsonschema.validate(json.loads(text), schema)
    assert whitespace_outside_strings(text) == [], text


@pytest.mark.parametrize("setup_name", SETUPS)
def test_json_object_outputs_are_objects(setup_name):
  setup = SETUPS[setup_name]()
  texts = _outputs(setup, StructuredOutputSpec.json_object(), seed=1, num=8, max_steps=30000)
  for text in texts:
    assert isinstance(json.loads(text), dict)
    assert whitespace_outside_strings(text) == [], text


def test_spaced_whitespace_policy_is_bounded():
  setup = llama3_bpe()
  spec = StructuredOutputSpec.json_schema(PERSON, whitespace=WhitespacePolicy.SPACED)
  for text in _outputs(setup, spec, seed=5):
    jsonschema.validate(json.loads(text), PERSON)
    assert "  " not in re.sub(r'"(\\.|[^"\\])*"', '""', text)  # never two spaces in a row
    assert ", " in text or ": " in text


@pytest.mark.parametrize("setup_name", SETUPS)
@pytest.mark.parametrize(
  "pattern",
  [
    r"[0-9]{3}-[a-z]{2,5}",
    r"(cat|dog)s?( [0-9]+)?",
    r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)",
    r"(ab|a)*c",
  ],
)
def test_regex_outputs_fullmatch(setup_name, pattern):
  setup = SETUPS[setup_name]()
  for text in _outputs(setup, StructuredOutputSpec.regex(pattern), seed=2):
    assert re.fullmatch(pattern, text), (pattern, text)


@pytest.mark.parametrize("setup_name", SETUPS)
def test_choice_outputs_are_choices(setup_name):
  setup = SETUPS[setup_name]()
  choices = ["red", "green", "blue", "light blue", "Ünïcödé"]
  texts = _outputs(setup, StructuredOutputSpec.choice(choices), seed=3, num=40)
  assert set(texts) <= set(choices)
  assert len(set(texts)) >= 3  # the random picker reaches several of them


@pytest.mark.parametrize(
  "grammar, python_regex",
  [
    (
      'start: greeting " " NAME\ngreeting: "hi" | "hello"\nNAME: /[a-z]{1,6}/',
      r"(hi|hello) [a-z]{1,6}",
    ),
    ('root ::= ("yes" | "no") "," [0-9] [0-9]?', r"(yes|no),[0-9][0-9]?"),  # GBNF
  ],
)
def test_grammar_outputs_match(grammar, python_regex):
  setup = llama3_bpe()
  for text in _outputs(setup, StructuredOutputSpec.grammar(grammar), seed=4):
    assert re.fullmatch(python_regex, text), text
