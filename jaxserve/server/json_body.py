"""A request's body as JSON: an object, nested at most MAX_JSON_DEPTH levels, whose every string is
valid Unicode (server/encodable.py); anything else is a 400 with OpenAI's error body.

Depth: Python's JSON parser recurses once per array or object, and so does what walks a body
after it (the Unicode check, chat templates, the JSON schemas of structured outputs and tools), so
a body of 2 KB of brackets nested a thousand levels deep ended in a RecursionError, a 500. The
parsed body's depth is measured level by level, without recursion and without a Python step per
scalar (a list of a million token ids costs one C pass); a body too deep for the parser itself
(its RecursionError) gets the same 400. 128 levels is far beyond what a request needs (a chat
message's content part is 4 levels deep, a tool's JSON schema adds two per nested object) and far
below the interpreter's recursion limit (1000 frames).
"""

from __future__ import annotations

import json

from starlette.requests import Request

from jaxserve.server.encodable import check_encodable
from jaxserve.server.errors import ApiError, bad_request

MAX_JSON_DEPTH = 128
_CONTAINERS = frozenset((dict, list))


async def read_json(request: Request) -> dict:
  """The body of `request` as parse_json_body returns it."""
  return parse_json_body(await request.body())


def parse_json_body(raw: bytes) -> dict:
  """The JSON object in `raw`; an ApiError (400) naming what is wrong otherwise."""
  try:
    body = json.loads(raw)
  except RecursionError:
    raise too_deep() from None
  except (UnicodeDecodeError, json.JSONDecodeError) as err:
    raise ApiError(400, f"the body is not valid JSON: {err}") from err
  if not isinstance(body, dict):
    raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
  if nested_deeper_than(body, MAX_JSON_DEPTH):
    raise too_deep()
  try:
    check_encodable(body)
  except ValueError as err:
    raise bad_request(err) from err
  return body


def too_deep() -> ApiError:
  return ApiError(
    400,
    f"the body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep "
    f"(the limit is {MAX_JSON_DEPTH})",
  )


def nested_deeper_than(value: dict | list, limit: int) -> bool:
  """Whether `value` (parsed JSON) holds arrays and objects more than `limit` levels deep; the
  value itself is level 1."""
  level, containers = 1, [value]
  while containers:
    if level > limit:
      return True
    inner = []
    for container in containers:
      items = container.values() if isinstance(container, dict) else container
      if not _CONTAINERS.isdisjoint(map(type, items)):
        inner.extend(item for item in items if type(item) in _CONTAINERS)
    containers, level = inner, level + 1
  return False
