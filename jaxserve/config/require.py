"""The one check every configuration dataclass uses: a ValueError naming the field."""

from __future__ import annotations


def require(condition: bool, name: str, message: str) -> None:
  """Raises ValueError("name: message") unless condition holds."""
  if not condition:
    raise ValueError(f"{name}: {message}")


def is_int_at_least(value: object, minimum: int, *, optional: bool = False) -> bool:
  """value is an integer (not a bool) >= minimum, or None where `optional`."""
  if value is None:
    return optional
  return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def require_bool(value: object, name: str) -> None:
  """Raises ValueError("name: must be true or false, got ...") unless value is a bool."""
  require(isinstance(value, bool), name, f"must be true or false, got {value!r}")
