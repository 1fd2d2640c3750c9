"""vLLM's sleep-mode routes, served only in its development mode (VLLM_SERVER_DEV_MODE=1 in the API
server's environment, read by `dev_mode`; without it they are unknown routes, a 404 with
OpenAI's error body, as vLLM does not serve them either):

* POST /sleep?level=1&mode=abort: the engine core sleeps (engine/sleep_mode.py): 200, empty body.
  Requests running or waiting are aborted (their streams end with finish_reason "abort");
  requests that arrive while it sleeps are accepted and wait until it wakes (neither lost nor
  refused: a client sees a slow first token).
* POST /wake_up?tags=weights&tags=kv_cache (no tags: everything): 200, empty body.
* GET /is_sleeping: {"is_sleeping": bool}.

A refusal is a 400 naming its field: `level` other than 1 (or not an integer), `mode` other than
abort, an unknown tag, or `enable_sleep_mode` when the engine was started without
--enable-sleep-mode (vLLM answers that one with a 500).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jaxserve.server.errors import bad_request
from jaxserve.server.state import ServingState

DEV_MODE_VARIABLE = "VLLM_SERVER_DEV_MODE"


def dev_mode(environ: Mapping[str, str]) -> bool:
  """vLLM's reading of VLLM_SERVER_DEV_MODE: an integer, on unless 0 (unset: off)."""
  value = environ.get(DEV_MODE_VARIABLE, "0").strip() or "0"
  try:
    return bool(int(value))
  except ValueError as err:
    raise ValueError(
      f"{DEV_MODE_VARIABLE}: must be an integer (1 on, 0 off), got {value!r}"
    ) from err


def sleep_routes() -> list[Route]:
  return [
    Route("/sleep", sleep, methods=["POST"]),
    Route("/wake_up", wake_up, methods=["POST"]),
    Route("/is_sleeping", is_sleeping, methods=["GET"]),
  ]


async def sleep(request: Request) -> Response:
  state: ServingState = request.app.state.serving
  level = request.query_params.get("level", "1")
  mode = request.query_params.get("mode", "abort")
  try:
    if not level.strip().lstrip("-").isdigit():
      raise ValueError(f"level: must be an integer, got {level!r}")
    await state.engine.sleep(int(level), mode)
  except ValueError as err:
    raise bad_request(err) from err
  return Response(status_code=200)


async def wake_up(request: Request) -> Response:
  state: ServingState = request.app.state.serving
  tags = request.query_params.getlist("tags") or None
  try:
    await state.engine.wake_up(tags)
  except ValueError as err:
    raise bad_request(err) from err
  return Response(status_code=200)


async def is_sleeping(request: Request) -> Response:
  state: ServingState = request.app.state.serving
  return JSONResponse({"is_sleeping": await state.engine.is_sleeping()})
