"""StructuredOutputSpec: parsing the three API shapes, errors naming the field, cache-key
equality."""

from __future__ import annotations

import pytest

from jaxserve.server.errors import bad_request
from jaxserve.structured import (
  ConstraintKind,
  StructuredOutputError,
  StructuredOutputSpec,
  WhitespacePolicy,
  coerce_spec,
  parse_response_format,
  parse_structured_outputs,
  spec_from_request,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_response_format_shapes():
  assert parse_response_format(None) is None
  assert parse_response_format({"type": "text"}) is None
  assert parse_response_format({"type": "json_object"}).kind is ConstraintKind.JSON_OBJECT
  spec = parse_response_format(
    {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
  )
  assert spec.kind is ConstraintKind.JSON_SCHEMA
  assert spec.schema() == SCHEMA
  assert spec.whitespace is WhitespacePolicy.COMPACT
  assert spec.param == "response_format.json_schema.schema"


def test_structured_outputs_shapes():
  assert parse_structured_outputs({"json": SCHEMA}).schema() == SCHEMA
  assert parse_structured_outputs({"json": '{"type": "string"}'}).schema() == {"type": "string"}
  assert parse_structured_outputs({"regex": "[a-z]+"}).source == "[a-z]+"
  assert parse_structured_outputs({"choice": ["x", "y"]}).choices == ("x", "y")
  assert parse_structured_outputs({"grammar": 'root ::= "a"'}).kind is ConstraintKind.GRAMMAR
  assert parse_structured_outputs({"json_object": True}).kind is ConstraintKind.JSON_OBJECT
  # what a client serializing vLLM's StructuredOutputsParams sends: nulls and default flags
  full = {
    "json": None,
    "regex": "a+",
    "choice": None,
    "grammar": None,
    "json_object": False,
    "disable_fallback": False,
    "disable_any_whitespace": False,
  }
  assert parse_structured_outputs(full) == StructuredOutputSpec.regex("a+")


@pytest.mark.parametrize(
  "value, param",
  [
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    (
      {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
      "response_format.json_schema.name",
    ),
    (
      {"type": "json_schema", "json_schema": {"name": "has space", "schema": SCHEMA}},
      "response_format.json_schema.name",
    ),
    ({"type": "json_schema", "json_schema": {"name": "n"}}, "response_format.json_schema.schema"),
    (
      {"type": "json_schema", "json_schema": {"name": "n", "schema": [1]}},
      "response_format.json_schema.schema",
    ),
    (
      {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": "yes"}},
      "response_format.json_schema.strict",
    ),
    ("json", "response_format"),
  ],
)
def test_response_format_errors_name_the_field(value, param):
  with pytest.raises(StructuredOutputError) as err:
    parse_response_format(value)
  assert err.value.param == param
  assert str(err.value).startswith(f"{param}: ")


@pytest.mark.parametrize(
  "value, param",
  [
    ({}, "structured_outputs"),
    ({"json": SCHEMA, "regex": "a"}, "structured_outputs"),
    ({"regex": 5}, "structured_outputs.regex"),
    ({"regex": ""}, "structured_outputs.regex"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"choice": "ab"}, "structured_outputs.choice"),
    ({"choice": ["a", 3]}, "structured_outputs.choice[1]"),
    ({"json": "{not json"}, "structured_outputs.json"),
    ({"json": 3}, "structured_outputs.json"),
    ({"grammar": ""}, "structured_outputs.grammar"),
    ({"json_object": "yes"}, "structured_outputs.json_object"),
    ({"regex": "a", "whitespace_pattern": " "}, "structured_outputs.whitespace_pattern"),
    ({"regex": "a", "disable_fallback": "no"}, "structured_outputs.disable_fallback"),
    ([1], "structured_outputs"),
  ],
)
def test_structured_outputs_errors_name_the_field(value, param):
  with pytest.raises(StructuredOutputError) as err:
    parse_structured_outputs(value)
  assert err.value.param == param


def test_error_becomes_a_400_with_param():
  with pytest.raises(StructuredOutputError) as err:
    parse_response_format({"type": "json_schema", "json_schema": {"name": "n"}})
  api_error = bad_request(err.value)
  assert api_error.status == 400
  assert api_error.body()["error"]["param"] == "response_format.json_schema.schema"


def test_both_fields_is_an_error():
  assert spec_from_request({"type": "json_object"}, None).kind is ConstraintKind.JSON_OBJECT
  assert spec_from_request(None, {"regex": "a"}).kind is ConstraintKind.REGEX
  assert spec_from_request({"type": "text"}, None) is None
  with pytest.raises(StructuredOutputError) as err:
    spec_from_request({"type": "json_object"}, {"regex": "a"})
  assert err.value.param == "structured_outputs"


def test_specs_compare_by_content_not_by_field_or_key_order():
  a = StructuredOutputSpec.json_schema({"type": "object", "required": ["a"]}, param="x")
  b = StructuredOutputSpec.json_schema({"required": ["a"], "type": "object"}, param="y")
  assert a == b and hash(a) == hash(b)
  assert a != StructuredOutputSpec.json_schema({"type": "object"})
  assert a != StructuredOutputSpec.json_schema(
    {"type": "object", "required": ["a"]}, whitespace=WhitespacePolicy.SPACED
  )


def test_coerce_spec_for_sampling_params():
  spec = StructuredOutputSpec.choice(["a", "b"])
  assert coerce_spec(spec) is spec
  assert coerce_spec(None) is None
  assert coerce_spec({"choice": ["a", "b"]}) == spec
  with pytest.raises(StructuredOutputError):
    coerce_spec({"choice": ["a", "b"], "regex": "a"})


def test_spec_is_frozen_and_checks_its_payload():
  spec = StructuredOutputSpec.regex("a")
  with pytest.raises(AttributeError):
    spec.source = "b"  # type: ignore[misc]
  with pytest.raises(StructuredOutputError):
    StructuredOutputSpec(ConstraintKind.JSON_SCHEMA)
  with pytest.raises(ValueError):
    StructuredOutputSpec.regex("a").schema()
