"""The Starlette app: OpenAI routes, utility routes, the guard middleware, error handlers.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models (a card per served model
name, server.served_model_name), GET /v1/models/{id} (404 model_not_found for another id), POST
/tokenize, POST /detokenize, GET /tokenizer_info (server/tokenizer_info.py), GET /health (200
ready, 200 "degraded" while some of several engine cores are gone, 503 while draining or once
every engine core is gone), GET /metrics (Prometheus text), GET /version ({"version":
jaxserve's}); with dev_mode (VLLM_SERVER_DEV_MODE=1), vLLM's POST /sleep, POST /wake_up and GET
/is_sleeping (server/sleep_routes.py). Every error, including unknown routes, has OpenAI's body
shape; bad input is never a 5xx.
"""

from __future__ import annotations

import contextlib
import logging

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jaxserve.config import ServerConfig
from jaxserve.config.generation_config import GenerationDefaults
from jaxserve.core.dp_client import EngineClient
from jaxserve.core.streams import EngineDeadError
from jaxserve.engine.admission import check_token_ids
from jaxserve.server.chat import create_chat_completion
from jaxserve.server.chat_prompt import encode_chat_prompt, parse_chat_prompt
from jaxserve.server.completions import create_completion
from jaxserve.server.errors import ApiError, bad_request, internal, unavailable
from jaxserve.server.generation import ClientDisconnected
from jaxserve.server.json_body import read_json
from jaxserve.server.metrics import CONTENT_TYPE, ServerMetrics
from jaxserve.server.middleware import GuardMiddleware
from jaxserve.server.sleep_routes import sleep_routes
from jaxserve.server.state import ServingState
from jaxserve.server.tokenizer_info import tokenizer_info
from jaxserve.tokenizer.tokenizer import Tokenizer
from jaxserve.version import VERSION

logger = logging.getLogger(__name__)


def build_app(
  engine: EngineClient,
  tokenizer: Tokenizer,
  config: ServerConfig,
  *,
  model_name: str,
  max_model_len: int,
  vocab_size: int,
  metrics_dir: str | None = None,
  generation_defaults: GenerationDefaults = GenerationDefaults(),
  dev_mode: bool = False,
) -> Starlette:
  """The app over an EngineClient (a CoreClient, or a DataParallelClient over several engine
  cores), which the app attaches on its event loop (run it with uvicorn's
  lifespan on); one client per app. metrics_dir: where the API server processes of one
  supervisor share their request metrics (server/metrics.py; None: this app's alone);
  generation_defaults: the model's sampling defaults (jaxserve/config/generation_config.py);
  dev_mode: serve the sleep-mode routes (server/sleep_routes.dev_mode reads
  VLLM_SERVER_DEV_MODE)."""
  names = config.model_names(model_name)
  state = ServingState(
    engine=engine,
    tokenizer=tokenizer,
    config=config,
    model_names=names,
    max_model_len=max_model_len,
    vocab_size=vocab_size,
    metrics=ServerMetrics(engine, names[0], metrics_dir),
    generation_defaults=generation_defaults,
  )
  routes = [
    Route("/v1/completions", create_completion, methods=["POST"]),
    Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", retrieve_model, methods=["GET"]),
    Route("/version", version, methods=["GET"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
  ]
  if dev_mode:
    routes += sleep_routes()
  handlers = {
    ApiError: _api_error,
    HTTPException: _http_error,
    EngineDeadError: _engine_dead,
    ClientDisconnected: _client_gone,
    ClientDisconnect: _client_gone,
    Exception: _unexpected,
  }

  @contextlib.asynccontextmanager
  async def lifespan(app: Starlette):
    await engine.attach()
    try:
      yield
    finally:
      await engine.detach()

  app = Starlette(
    routes=routes,
    middleware=[Middleware(GuardMiddleware, state=state)],
    exception_handlers=handlers,
    lifespan=lifespan,
  )
  app.state.serving = state
  return app


def serving_state(app: Starlette) -> ServingState:
  return app.state.serving


def _model_card(state: ServingState, name: str) -> dict:
  return {
    "id": name,
    "object": "model",
    "created": state.created,
    "owned_by": "jaxserve",
    "max_model_len": state.max_model_len,
  }


async def list_models(request: Request) -> Response:
  state: ServingState = request.app.state.serving
  return JSONResponse(
    {"object": "list", "data": [_model_card(state, name) for name in state.model_names]}
  )


async def retrieve_model(request: Request) -> Response:
  """GET /v1/models/{id} (client.models.retrieve): the card of that served name, else a 404."""
  state: ServingState = request.app.state.serving
  name = request.path_params["model_id"]
  state.check_model({"model": name})
  return JSONResponse(_model_card(state, name))


async def version(request: Request) -> Response:
  return JSONResponse({"version": VERSION})


async def tokenize(request: Request) -> Response:
  """{prompt} or {messages} -> {tokens, count, max_model_len, token_strs}: a chat prompt as the
  chat route renders it (add_generation_prompt, continue_final_message, chat_template_kwargs:
  server/chat_prompt.py); token_strs, with return_token_strs, each token's vocabulary string
  (vLLM's, transformers' convert_ids_to_tokens), else null."""
  state: ServingState = request.app.state.serving
  body = await read_json(request)
  state.check_model(body)
  try:
    content = await state.run_blocking(_tokenize_body, state, body)
  except ValueError as err:
    raise bad_request(err, {"chat_template": "messages"}) from err
  return Response(content, media_type="application/json")


def _tokenize_body(state: ServingState, body: dict) -> bytes:
  """The /tokenize response, built in the thread pool: the encode releases the GIL, and msgspec
  (already the IPC codec) writes 3 million ids in a twelfth of json.dumps' time (both hold the
  GIL), so the event loop waits for neither."""
  if "messages" in body:
    prompt = parse_chat_prompt(body)
    defaults = state.config.default_chat_template_kwargs
    tokens = encode_chat_prompt(state.tokenizer, prompt, defaults)
  elif isinstance(body.get("prompt"), str):
    add_special_tokens = body.get("add_special_tokens", True) is not False
    tokens = state.tokenizer.encode(body["prompt"], add_special_tokens)
  else:
    raise ValueError("prompt: give a string `prompt` or a `messages` list")
  return_token_strs = body.get("return_token_strs") or False
  if not isinstance(return_token_strs, bool):
    raise ValueError(f"return_token_strs: must be a boolean, got {return_token_strs!r}")
  token_strs = [state.tokenizer.id_to_token(t) for t in tokens] if return_token_strs else None
  return msgspec.json.encode(
    {
      "tokens": tokens,
      "count": len(tokens),
      "max_model_len": state.max_model_len,
      "token_strs": token_strs,
    }
  )


async def detokenize(request: Request) -> Response:
  """{tokens} -> {prompt}."""
  state: ServingState = request.app.state.serving
  body = await read_json(request)
  state.check_model(body)
  try:
    text = await state.run_blocking(_detokenize, state, body.get("tokens"))
  except ValueError as err:
    raise bad_request(err) from err
  return JSONResponse({"prompt": text})


def _detokenize(state: ServingState, tokens: object) -> str:
  """The text of `tokens`, checked and decoded in the thread pool (a long list's decode
  releases the GIL: Tokenizer.decode)."""
  if not isinstance(tokens, list) or not all(
    isinstance(t, int) and not isinstance(t, bool) for t in tokens
  ):
    raise ValueError("tokens: must be a list of token ids")
  check_token_ids(tokens, state.vocab_size, "tokens")
  return state.tokenizer.decode(tokens)


async def health(request: Request) -> Response:
  """200 {"status": "ok"}; 200 {"status": "degraded", ...} while some engine cores of several
  are gone (the others serve: a load balancer keeps sending, monitoring sees the body and
  jaxserve_engine_cores_alive); 503 while draining or once every core is gone."""
  state: ServingState = request.app.state.serving
  if state.ready and state.engine.degraded:
    cores = state.engine.core_states()
    return JSONResponse(
      {
        "status": "degraded",
        "engine_cores": len(cores),
        "engine_cores_alive": [core.index for core in cores if core.alive],
      }
    )
  if state.ready:
    return JSONResponse({"status": "ok"})
  reason = "draining" if state.draining.is_set() else "engine stopped"
  return JSONResponse({"status": reason}, status_code=503)


async def metrics(request: Request) -> Response:
  state: ServingState = request.app.state.serving
  return Response(state.metrics.render(), media_type=CONTENT_TYPE)


async def _api_error(request: Request, err: ApiError) -> Response:
  return err.response()


async def _http_error(request: Request, err: HTTPException) -> Response:
  if err.status_code == 404:
    return ApiError(404, f"no route {request.url.path}", code="not_found").response()
  if err.status_code == 405:
    return ApiError(
      405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed"
    ).response()
  return ApiError(err.status_code, str(err.detail)).response()


async def _engine_dead(request: Request, err: EngineDeadError) -> Response:
  return unavailable(str(err)).response()


async def _client_gone(request: Request, err: Exception) -> Response:
  return Response(status_code=499)


async def _unexpected(request: Request, err: Exception) -> Response:
  logger.exception("unexpected error on %s", request.url.path, exc_info=err)
  return internal(f"internal error: {type(err).__name__}").response()
