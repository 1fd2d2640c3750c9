"""What a request constrains its output to: `StructuredOutputSpec`, parsed from the API shapes.

Three shapes reach the engine:
* OpenAI `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`, or
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`;
* vLLM's extra field `structured_outputs`: exactly one of `json` (a schema, as an object or its
  JSON text), `regex`, `choice` (a list of strings), `grammar` (Lark or GBNF/EBNF text) or
  `json_object: true`; vLLM's boolean options (`disable_fallback`, `disable_any_whitespace`,
  `disable_additional_properties`) are accepted and have no effect, keys set to null are ignored;
* `SamplingParams.structured_outputs` in `LLM.generate`: a `StructuredOutputSpec` or the same
  mapping as the vLLM field (`coerce_spec`).

Bad input raises `StructuredOutputError`, a ValueError worded "param: message" whose `param` is
the request field (`response_format.json_schema.schema`, `structured_outputs.regex`, ...), so the
server's `bad_request` turns it into OpenAI's 400 body with that `param`.

A spec is hashable and compares by content (the schema is kept as canonical JSON text), so it is
the key of the compiled-grammar cache; `param` is carried for error messages and not compared.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RESPONSE_FORMAT = "response_format"
STRUCTURED_OUTPUTS = "structured_outputs"
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_VLLM_CONSTRAINT_KEYS = ("json", "regex", "choice", "grammar", "json_object")
_VLLM_IGNORED_FLAGS = (
  "disable_fallback",
  "disable_any_whitespace",
  "disable_additional_properties",
)

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]


class StructuredOutputError(ValueError):
  """Invalid constraint input; `param` names the request field, str(err) is "param: message"."""

  def __init__(self, param: str, message: str) -> None:
    super().__init__(f"{param}: {message}")
    self.param = param
    self.detail = message


class ConstraintKind(str, enum.Enum):
  JSON_SCHEMA = "json_schema"
  JSON_OBJECT = "json_object"
  REGEX = "regex"
  CHOICE = "choice"
  GRAMMAR = "grammar"


class WhitespacePolicy(str, enum.Enum):
  """Whitespace allowed in constrained JSON outside strings.

  COMPACT (default): none, separators "," and ":" (a random model cannot loop on whitespace).
  SPACED: exactly one space after "," and ":", as Python's json.dumps writes; nothing else.
  FLEXIBLE: any JSON whitespace anywhere (unbounded; only for callers that ask for it).
  """

  COMPACT = "compact"
  SPACED = "spaced"
  FLEXIBLE = "flexible"


@dataclass(frozen=True)
class StructuredOutputSpec:
  """One constraint. `source` is the canonical schema JSON (JSON_SCHEMA), the regex (REGEX) or
  the grammar text (GRAMMAR); `choices` is set for CHOICE only."""

  kind: ConstraintKind
  source: str = ""
  choices: tuple[str, ...] = ()
  whitespace: WhitespacePolicy = WhitespacePolicy.COMPACT
  param: str = dataclasses.field(default=STRUCTURED_OUTPUTS, compare=False)

  def __post_init__(self) -> None:
    object.__setattr__(self, "kind", ConstraintKind(self.kind))
    object.__setattr__(self, "whitespace", WhitespacePolicy(self.whitespace))
    object.__setattr__(self, "choices", tuple(self.choices))
    needs_source = self.kind in (
      ConstraintKind.JSON_SCHEMA,
      ConstraintKind.REGEX,
      ConstraintKind.GRAMMAR,
    )
    if needs_source and not (isinstance(self.source, str) and self.source):
      raise StructuredOutputError(
        self.param, f"a {self.kind.value} constraint needs a non-empty source"
      )
    if self.kind is ConstraintKind.CHOICE:
      _check_choices(self.choices, self.param)

  @classmethod
  def json_schema(
    cls,
    schema: Mapping[str, JsonValue],
    *,
    param: str = STRUCTURED_OUTPUTS,
    whitespace: WhitespacePolicy = WhitespacePolicy.COMPACT,
  ) -> StructuredOutputSpec:
    return cls(
      ConstraintKind.JSON_SCHEMA,
      _canonical_schema(schema, param),
      whitespace=whitespace,
      param=param,
    )

  @classmethod
  def json_object(
    cls, *, param: str = STRUCTURED_OUTPUTS, whitespace: WhitespacePolicy = WhitespacePolicy.COMPACT
  ) -> StructuredOutputSpec:
    return cls(ConstraintKind.JSON_OBJECT, whitespace=whitespace, param=param)

  @classmethod
  def regex(cls, pattern: str, *, param: str = STRUCTURED_OUTPUTS) -> StructuredOutputSpec:
    return cls(ConstraintKind.REGEX, _nonempty_str(pattern, param), param=param)

  @classmethod
  def choice(
    cls, choices: Sequence[str], *, param: str = STRUCTURED_OUTPUTS
  ) -> StructuredOutputSpec:
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
      raise StructuredOutputError(param, f"must be a list of strings, got {type(choices).__name__}")
    return cls(ConstraintKind.CHOICE, choices=tuple(choices), param=param)

  @classmethod
  def grammar(cls, text: str, *, param: str = STRUCTURED_OUTPUTS) -> StructuredOutputSpec:
    return cls(ConstraintKind.GRAMMAR, _nonempty_str(text, param), param=param)

  def schema(self) -> dict[str, JsonValue]:
    """The JSON schema this spec enforces (JSON_OBJECT: any object)."""
    if self.kind is ConstraintKind.JSON_OBJECT:
      return {"type": "object"}
    if self.kind is not ConstraintKind.JSON_SCHEMA:
      raise ValueError(f"{self.param}: a {self.kind.value} constraint has no JSON schema")
    return json.loads(self.source)


def _check_choices(choices: tuple[str, ...], param: str) -> None:
  if not choices:
    raise StructuredOutputError(param, "must be a non-empty list of strings")
  for i, choice in enumerate(choices):
    if not isinstance(choice, str) or not choice:
      raise StructuredOutputError(f"{param}[{i}]", f"must be a non-empty string, got {choice!r}")


def _nonempty_str(value: object, param: str) -> str:
  if not isinstance(value, str) or not value:
    raise StructuredOutputError(param, f"must be a non-empty string, got {value!r}")
  return value


def _canonical_schema(schema: object, param: str) -> str:
  """The schema as canonical JSON text; a string is parsed first (vLLM accepts schema text)."""
  if isinstance(schema, str):
    try:
      schema = json.loads(schema)
    except json.JSONDecodeError as e:
      raise StructuredOutputError(param, f"is not valid JSON: {e}") from e
  if not isinstance(schema, Mapping):
    raise StructuredOutputError(param, f"must be a JSON schema object, got {type(schema).__name__}")
  try:
    return json.dumps(
      schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
  except (TypeError, ValueError) as e:
    raise StructuredOutputError(param, f"is not JSON-serializable: {e}") from e


def _mapping(value: object, param: str) -> Mapping[str, object]:
  if not isinstance(value, Mapping):
    raise StructuredOutputError(param, f"must be an object, got {type(value).__name__}")
  return value


def parse_response_format(
  value: object, param: str = RESPONSE_FORMAT
) -> StructuredOutputSpec | None:
  """OpenAI's `response_format`; None for `{"type": "text"}` or a missing field."""
  if value is None:
    return None
  fmt = _mapping(value, param)
  kind = fmt.get("type")
  if kind == "text":
    return None
  if kind == "json_object":
    return StructuredOutputSpec.json_object(param=param)
  if kind != "json_schema":
    raise StructuredOutputError(
      f"{param}.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}"
    )
  body = _mapping(fmt.get("json_schema"), f"{param}.json_schema")
  name = body.get("name")
  if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
    raise StructuredOutputError(
      f"{param}.json_schema.name", f"must match {_SCHEMA_NAME.pattern}, got {name!r}"
    )
  if body.get("strict") is not None and not isinstance(body.get("strict"), bool):
    raise StructuredOutputError(f"{param}.json_schema.strict", "must be a boolean")
  if body.get("schema") is None:
    raise StructuredOutputError(f"{param}.json_schema.schema", "is required")
  return StructuredOutputSpec.json_schema(body["schema"], param=f"{param}.json_schema.schema")


def parse_structured_outputs(
  value: object, param: str = STRUCTURED_OUTPUTS
) -> StructuredOutputSpec | None:
  """vLLM's `structured_outputs` field (exactly one constraint key); None when absent."""
  if value is None:
    return None
  fields = {k: v for k, v in _mapping(value, param).items() if v is not None}
  for key, flag in fields.items():
    if key not in _VLLM_CONSTRAINT_KEYS + _VLLM_IGNORED_FLAGS:
      raise StructuredOutputError(f"{param}.{key}", "is not a supported structured_outputs option")
    if key in _VLLM_IGNORED_FLAGS and not isinstance(flag, bool):
      raise StructuredOutputError(f"{param}.{key}", "must be a boolean")
  if fields.get("json_object") is False:
    del fields["json_object"]
  given = [k for k in _VLLM_CONSTRAINT_KEYS if k in fields]
  if len(given) != 1:
    raise StructuredOutputError(
      param,
      "exactly one of json, regex, choice, grammar or json_object "
      f"must be set, got {given or 'none'}",
    )
  key = given[0]
  where = f"{param}.{key}"
  if key == "json":
    return StructuredOutputSpec.json_schema(fields[key], param=where)
  if key == "json_object":
    if fields[key] is not True:
      raise StructuredOutputError(where, "must be a boolean")
    return StructuredOutputSpec.json_object(param=where)
  if key == "regex":
    return StructuredOutputSpec.regex(fields[key], param=where)
  if key == "choice":
    return StructuredOutputSpec.choice(fields[key], param=where)
  return StructuredOutputSpec.grammar(fields[key], param=where)


def coerce_spec(value: object, param: str = STRUCTURED_OUTPUTS) -> StructuredOutputSpec | None:
  """What `SamplingParams.structured_outputs` accepts: a spec, a vLLM-style mapping, or None."""
  if value is None or isinstance(value, StructuredOutputSpec):
    return value
  return parse_structured_outputs(value, param)


def spec_from_request(
  response_format: object, structured_outputs: object
) -> StructuredOutputSpec | None:
  """The constraint of one request; setting both fields is an error naming structured_outputs."""
  from_format = parse_response_format(response_format)
  from_vllm = parse_structured_outputs(structured_outputs)
  if from_format is not None and from_vllm is not None:
    raise StructuredOutputError(STRUCTURED_OUTPUTS, "cannot be combined with response_format")
  return from_vllm if from_vllm is not None else from_format
