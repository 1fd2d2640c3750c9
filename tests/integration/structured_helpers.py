"""Schemas and checks shared by the structured-output engine and server tests.

Every schema is bounded (integers with a range, strings and arrays with a maximum length), so a
random-weight model, which writes whatever the mask allows, always finishes its JSON within a
few dozen tokens: an output that does not parse is then a bug, not a model that rambled.
"""

from __future__ import annotations

import json
import re

import jsonschema

PERSON = {
  "type": "object",
  "additionalProperties": False,
  "required": ["name", "age", "status", "address", "tags"],
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "status": {"enum": ["active", "inactive", "banned"]},
    "verified": {"type": "boolean"},
    "address": {
      "type": "object",
      "additionalProperties": False,
      "required": ["city"],
      "properties": {
        "city": {"type": "string", "maxLength": 5},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
      },
    },
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
  },
}
POINTS = {
  "type": "array",
  "minItems": 1,
  "maxItems": 2,
  "items": {
    "type": "object",
    "additionalProperties": False,
    "required": ["x", "y"],
    "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}, "y": {"enum": [0, 1, 2]}},
  },
}
SCHEMAS = {"person": PERSON, "points": POINTS}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ("yes", "no", "maybe")
MAX_TOKENS = 120  # far above what the bounded schemas can take


def assert_valid_json(text: str, schema: dict) -> None:
  """Parses and validates with jsonschema (not with the grammar engine under test); compact JSON
  (no whitespace outside strings) is what the default whitespace policy allows."""
  value = json.loads(text)
  jsonschema.validate(value, schema)
  assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False) or "\\" in text, text


def assert_regex(text: str, pattern: str = REGEX) -> None:
  assert re.fullmatch(pattern, text), text
