"""Tuned tile tables: the measured block sizes of a kernel as data beside its code, read into
typed rows.

A kernel keeps its rules in code (how a tile follows the shape, what a tile must satisfy) and its
measured numbers in a JSON file in its package (shipped as package data: pyproject.toml's
[tool.setuptools.package-data]):

  {"about": "what the rows are and where they were measured",
   "rows": [{"field": value, ...}, ...]}

`load_table(package, name, row_type)` reads the file with importlib.resources (a wheel or a
source tree alike) and builds one `row_type` (a frozen dataclass of int, bool and `int | None`
fields) per row. Every row must name each field once, with a value of the field's type; a row
type's `check()` (optional) adds its own rules. A bad row raises ValueError naming the file, the
row's index and the row itself; nothing is loaded until a kernel asks (callers cache the tuple).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from importlib import resources
from typing import TypeVar

Row = TypeVar("Row")

_SCALARS = (bool, int, float, str)


def load_table(package: str, name: str, row_type: type[Row]) -> tuple[Row, ...]:
  """The rows of `name` (a JSON file in `package`) as `row_type` instances, in file order.
  Raises ValueError naming the file and the bad row."""
  where = f"{package.replace('.', '/')}/{name}"
  try:
    document = json.loads(resources.files(package).joinpath(name).read_text())
  except (OSError, json.JSONDecodeError) as err:
    raise ValueError(f"{where}: cannot read the table: {err}") from err
  if not isinstance(document, dict) or not isinstance(document.get("rows"), list):
    raise ValueError(f'{where}: must be an object with a "rows" list')
  rows = document["rows"]
  return tuple(parse_row(row, row_type, f"{where}: row {i}") for i, row in enumerate(rows))


def parse_row(row: object, row_type: type[Row], where: str) -> Row:
  """One row (a JSON object) as `row_type`; ValueError naming `where` and the row if a field is
  missing, unknown or of the wrong type, or the row type's check() refuses it."""
  hints = typing.get_type_hints(row_type)
  names = [f.name for f in dataclasses.fields(row_type)]
  if not isinstance(row, dict):
    raise ValueError(f"{where}: must be an object, got {row!r}")
  unknown, missing = sorted(set(row) - set(names)), [n for n in names if n not in row]
  if unknown or missing:
    raise ValueError(f"{where} {row}: unknown fields {unknown}, missing fields {missing}")
  for field in names:
    if not _has_type(row[field], hints[field]):
      raise ValueError(f"{where} {row}: {field} must be {_type_name(hints[field])}")
  value = row_type(**row)
  check = getattr(value, "check", None)
  if check is not None:
    try:
      check()
    except ValueError as err:
      raise ValueError(f"{where} {row}: {err}") from err
  return value


def _has_type(value: object, annotation: object) -> bool:
  if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
    return any(_has_type(value, option) for option in typing.get_args(annotation))
  if annotation is type(None):
    return value is None
  if annotation is int:  # JSON's true / false are not numbers here
    return isinstance(value, int) and not isinstance(value, bool)
  return annotation in _SCALARS and isinstance(value, annotation)


def _type_name(annotation: object) -> str:
  options = typing.get_args(annotation) or (annotation,)
  return " or ".join("null" if o is type(None) else o.__name__ for o in options)
