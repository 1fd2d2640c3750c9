"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status.

Handlers raise ApiError; a ValueError from validation ("field: message", as SamplingParams and
the engine word them) becomes a 400 whose `param` is that field.
"""

from __future__ import annotations

import json
import re

from starlette.responses import JSONResponse

from jaxserve.engine.admission import ContextLengthError

_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")


class ApiError(Exception):
  """An error the client sees with `status` and OpenAI's error body."""

  def __init__(
    self,
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
  ):
    super().__init__(message)
    self.status = status
    self.message = message
    self.type = type
    self.param = param
    self.code = code

  def body(self) -> dict:
    return {
      "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
    }

  def response(self) -> JSONResponse:
    return JSONResponse(self.body(), status_code=self.status)

  def sse_event(self) -> str:
    return f"data: {json.dumps(self.body())}\n\n"


def field_of(err: ValueError) -> str | None:
  """The field named by a "field: message" ValueError, e.g. "max_tokens"."""
  match = _FIELD_PREFIX.match(str(err))
  return match.group(1) if match else None


def bad_request(err: ValueError, rename: dict[str, str] | None = None) -> ApiError:
  """A 400 for a validation error; `rename` maps internal field names to the request's."""
  param = field_of(err)
  if param is not None and rename:
    param = rename.get(param, param)
  code = "context_length_exceeded" if isinstance(err, ContextLengthError) else None
  return ApiError(400, str(err), param=param, code=code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> ApiError:
  return ApiError(404, message, param=param, code=code)


def unauthorized() -> ApiError:
  return ApiError(
    401, "Incorrect or missing API key: send `Authorization: Bearer <key>`.", code="invalid_api_key"
  )


def body_too_large(limit: int) -> ApiError:
  return ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")


def queue_full(limit: int) -> ApiError:
  return ApiError(
    429,
    f"the server's waiting queue is full ({limit} requests); retry later",
    type="rate_limit_error",
    code="rate_limit_exceeded",
  )


def unavailable(reason: str) -> ApiError:
  return ApiError(503, reason, type="service_unavailable", code="service_unavailable")


def internal(message: str) -> ApiError:
  return ApiError(500, message, type="internal_server_error", code="internal_error")
