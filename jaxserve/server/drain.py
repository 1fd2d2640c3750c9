"""The end of a drain: when server.drain_timeout_s has passed since the stop signal, every
response still running ends cleanly: a stream gets an error event (503, service_unavailable)
and `data: [DONE]`, a non-streaming call a 503 body, and their requests are aborted.

end_now() does the same at once: a second Ctrl-C (server/uvicorn_runner.py) does not wait for the
timeout. uvicorn's own graceful-shutdown timeout is set UVICORN_GRACE_S later, so by the time it
would cancel the remaining tasks (a connection reset and a traceback per stream) none are left.
"""

from __future__ import annotations

import threading

from jaxserve.core.dp_client import EngineClient
from jaxserve.core.streams import EngineDeadError
from jaxserve.server.errors import ApiError, internal, unavailable

UVICORN_GRACE_S = 5.0


class DrainTimeoutError(EngineDeadError):
  """The drain timeout expired before this response finished."""


def stream_error(err: EngineDeadError) -> ApiError:
  """The error a stream ends with: 503 for the drain timeout, 500 when the engine died."""
  if isinstance(err, DrainTimeoutError):
    return unavailable(str(err))
  return internal(str(err))


class DrainTimer:
  """Started once at the stop signal; after timeout_s (or at end_now) it ends the engine's
  running streams."""

  def __init__(self, engine: EngineClient, timeout_s: float):
    self._engine = engine
    self._timeout_s = timeout_s
    self._timer: threading.Timer | None = None

  def start(self) -> None:
    if self._timer is None:
      self._timer = threading.Timer(self._timeout_s, self._expire)
      self._timer.daemon = True
      self._timer.start()

  def cancel(self) -> None:
    if self._timer is not None:
      self._timer.cancel()

  def end_now(self) -> None:
    """Ends the running streams now (the stop was repeated: no more waiting)."""
    self.cancel()
    self._end_streams("a second stop signal ended it at once")

  def _expire(self) -> None:
    self._end_streams(f"server.drain_timeout_s {self._timeout_s:g} s passed")

  def _end_streams(self, why: str) -> None:
    try:
      self._engine.end_streams(
        DrainTimeoutError(f"the server shut down before this response finished ({why})")
      )
    except EngineDeadError:
      pass  # the engine has already stopped: its streams are ended
