"""Every string of a request body must be encodable as UTF-8: the one check, on the parsed body.

JSON may carry lone UTF-16 surrogates ("\\ud800" escapes, or their CESU bytes, which Python's
json decodes with surrogatepass); no tokenizer can encode them, and a stop string or a chat
message holding one would fail deep in the engine. read_json (server/json_body.py) calls
check_encodable on every body, so every text field of every endpoint (prompt, messages, stop,
tools, /tokenize, ...) is refused up front with ValueError("<field>: ...") naming the field as
the body spells it (`messages[0].content`, `stop[1]`; a bad key names the object holding it).

The common case costs one C-level serialization (json.dumps then encode); only a body that
fails is walked in Python to find the field.
"""

from __future__ import annotations

import json

MESSAGE = "must be valid Unicode text (it holds a lone UTF-16 surrogate)"


def check_encodable(body: object, name: str = "") -> None:
  """ValueError naming the first field of `body` (a body, or the field `name`) whose string (a
  value or a key) is not encodable as UTF-8; nothing for a body without one."""
  try:
    json.dumps(body, ensure_ascii=False).encode("utf-8")
    return
  except UnicodeEncodeError:
    pass
  field = _first_bad_field(body, name)
  raise ValueError(f"{field or 'body'}: {MESSAGE}")


def _encodable(text: str) -> bool:
  try:
    text.encode("utf-8")
  except UnicodeEncodeError:
    return False
  return True


def _first_bad_field(value: object, path: str) -> str | None:
  if isinstance(value, str):
    return None if _encodable(value) else path
  if isinstance(value, dict):
    for key, item in value.items():
      child = f"{path}.{key}" if path else key
      if not _encodable(key):
        return path or "body"
      found = _first_bad_field(item, child)
      if found is not None:
        return found
  if isinstance(value, list):
    for i, item in enumerate(value):
      found = _first_bad_field(item, f"{path}[{i}]")
      if found is not None:
        return found
  return None
