"""The ASGI guard in front of every route: API key, draining, and the body size limit.

* With an API key set, the OpenAI routes (every path under /v1, as vLLM guards them) need
  `Authorization: Bearer <key>`, compared with hmac.compare_digest; the others (/health, /metrics,
  /version, /tokenize, /detokenize, /tokenizer_info) stay open, as in vLLM. The decision uses the
  ASGI scope's path, never a URL rebuilt from the Host header.
* While draining (after SIGTERM) every path but /health and /metrics gets 503.
* A body larger than max_body_bytes gets 413: refused from Content-Length when given, else by
  counting the bytes as they arrive. Bodies are read here in full and replayed to the app; after
  the body the app's receive channel is the server's, so handlers still see `http.disconnect`.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jaxserve.server.errors import ApiError, body_too_large, unauthorized, unavailable
from jaxserve.server.state import ServingState

OPEN_PATHS = ("/health", "/metrics")  # served while draining too
GUARDED_PREFIX = "/v1"  # what the API key guards (vLLM's AuthenticationMiddleware's rule)


class GuardMiddleware:
  def __init__(self, app: ASGIApp, state: ServingState):
    self.app = app
    self.state = state

  async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
      await self.app(scope, receive, send)
      return
    path = scope["path"]
    headers = dict(scope["headers"])
    error = None
    if (
      path.startswith(GUARDED_PREFIX)
      and self.state.config.api_key is not None
      and not self._authorized(headers)
    ):
      error = unauthorized()
    elif path not in OPEN_PATHS and self.state.draining.is_set():
      error = unavailable("the server is shutting down")
    if error is None:
      error, body = await self._read_body(headers, receive)
    if error is not None:
      await error.response()(scope, receive, send)
      return
    await self.app(scope, _replay(body, receive), send)

  def _authorized(self, headers: dict[bytes, bytes]) -> bool:
    expected = b"Bearer " + self.state.config.api_key.encode("utf-8")
    return hmac.compare_digest(headers.get(b"authorization", b""), expected)

  async def _read_body(
    self, headers: dict[bytes, bytes], receive: Receive
  ) -> tuple[ApiError | None, bytes | None]:
    limit = self.state.config.max_body_bytes
    length = headers.get(b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
      return body_too_large(limit), None
    chunks, size = [], 0
    while True:
      message = await receive()
      if message["type"] != "http.request":
        return None, None  # the client left while sending; the app sees the disconnect
      chunks.append(message.get("body", b""))
      size += len(chunks[-1])
      if size > limit:
        return body_too_large(limit), None
      if not message.get("more_body", False):
        return None, b"".join(chunks)


def _replay(body: bytes | None, receive: Receive) -> Receive:
  pending = body is not None

  async def replayed() -> Message:
    nonlocal pending
    if pending:
      pending = False
      return {"type": "http.request", "body": body, "more_body": False}
    return await receive()

  return replayed
