"""The two-column "name  value" table the benchmarks and tools print (names padded to the
longest)."""

from __future__ import annotations

from collections.abc import Sequence


def key_value_table(rows: Sequence[tuple[str, object]]) -> str:
  width = max((len(name) for name, _ in rows), default=0)
  return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
