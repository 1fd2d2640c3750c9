"""The one check every configuration dataclass uses: a ValueError naming the field."""

from __future__ import annotations


def require(condition: bool, name: str, message: str) -> None:
  """Raises ValueError("name: message") unless condition holds."""
  if not condition:
    raise ValueError(f"{name}: {message}")
