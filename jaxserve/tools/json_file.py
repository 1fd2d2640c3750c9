"""The one way a command writes its JSON result: parent folders made, indented, path returned."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: str | Path, data: object) -> Path:
  out = Path(path)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(data, indent=2))
  return out
