"""`jaxserve serve`: build and warm up the engine, then serve the OpenAI-compatible API.

The engine is built (model, buckets, KV pages, warmup; jaxserve/assembly.py logs each) before
uvicorn opens its socket, so once the server accepts connections /health is 200.

SIGTERM or SIGINT drains: the drain flag makes new requests (and /health) 503, uvicorn stops
accepting connections and waits up to server.drain_timeout_s for running responses to finish;
those still running then end with an error event and [DONE] (server/drain.py), the engine thread
stops and the process exits with status 0. While requests run, a stats line is logged every
server.stats_interval_s (server/stats_logger.py).

Multi-host: every host runs `jaxserve serve` with the same settings plus its --process-id (or
--distributed alone on a Cloud TPU VM, where JAX finds the slice's hosts). All of them join the
jax.distributed job first; process 0 then builds the engine and serves HTTP, the others run the
worker loop (jaxserve/follower.py) and exit 0 after process 0 stops.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time

import uvicorn

from jaxserve.cli_args import add_engine_args, engine_config_from_args
from jaxserve.structured.tool_parsers import tool_parser_names
from jaxserve.server.drain import UVICORN_GRACE_S, DrainTimer
from jaxserve.server.stats_logger import StatsLogger

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
  parser = subparsers.add_parser(
      "serve", help="serve the OpenAI-compatible HTTP API",
      description="Serve /v1/completions, /v1/chat/completions, /v1/models, /tokenize, "
      "/detokenize, /tokenizer_info, /health and /metrics. Without a MODEL it serves tiny-random.")
  parser.add_argument("model_tag", nargs="?", metavar="MODEL",
                      help="the model to serve, as --model (default: tiny-random)")
  add_engine_args(parser)
  group = parser.add_argument_group("server")
  group.add_argument("--host", help="address to bind (default 127.0.0.1)")
  group.add_argument("--port", type=int, help="port to bind (default 8000)")
  group.add_argument("--api-key", help="require `Authorization: Bearer KEY` (except on /health "
                     "and /metrics)")
  group.add_argument("--served-model-name", help="the model name clients send (default: --model)")
  group.add_argument("--tool-call-parser", choices=tool_parser_names(),
                     help="read tool calls from chat replies under tool_choice auto in this "
                     "chat format (llama3_json: Llama 3.x; hermes: Hermes / Qwen <tool_call>)")
  group = parser.add_argument_group("parallel")
  group.add_argument("--distributed", action="store_true",
                     help="join a multi-host jax.distributed job (auto-detected on Cloud TPU VMs)")
  group.add_argument("--coordinator-address", help="HOST:PORT of process 0's coordinator")
  group.add_argument("--num-processes", type=int, help="number of hosts in the job")
  group.add_argument("--process-id", type=int, help="this host's index, 0 serves HTTP")
  parser.set_defaults(func=serve)


class DrainingServer(uvicorn.Server):
  """uvicorn's server that also raises the app's drain flag when a stop signal arrives."""

  def __init__(self, config: uvicorn.Config, draining: threading.Event, drain_timer: DrainTimer):
    super().__init__(config)
    self.draining = draining
    self.drain_timer = drain_timer

  def handle_exit(self, sig, frame) -> None:
    if not self.draining.is_set():
      logger.info("signal %d: draining (new requests get 503)", sig)
    self.draining.set()
    self.drain_timer.start()
    super().handle_exit(sig, frame)


def serve(args: argparse.Namespace) -> int:
  from jaxserve.assembly import build_engine
  from jaxserve.parallel.multihost import initialize_distributed, is_worker
  from jaxserve.server.app import build_app, serving_state
  from jaxserve.server.async_engine import AsyncEngine

  for flag in ("host", "port", "api_key", "served_model_name", "tool_call_parser"):
    value = getattr(args, flag)
    if value is not None:
      args.overrides.append(f"server.{flag}={json.dumps(value)}")
  _parallel_overrides(args)
  config = engine_config_from_args(args)
  initialize_distributed(config.distributed)
  if is_worker():
    from jaxserve.follower import run_follower
    return run_follower(config)
  server_config = config.server
  start = time.monotonic()
  engine = build_engine(config)
  async_engine = AsyncEngine(engine).start()
  app = build_app(async_engine, engine.tokenizer, server_config, model_name=config.model,
                  max_model_len=engine.max_model_len, vocab_size=engine.vocab_size)
  state = serving_state(app)
  logger.info("ready in %.1fs (warmup %.1fs): serving %r on http://%s:%d%s", time.monotonic() - start,
              engine.warmup_seconds, state.model_name, server_config.host, server_config.port,
              " (API key required)" if server_config.api_key else "")
  uvicorn_config = uvicorn.Config(
      app, host=server_config.host, port=server_config.port, lifespan="off",
      log_level=args.log_level.lower(),
      timeout_graceful_shutdown=server_config.drain_timeout_s + UVICORN_GRACE_S)
  drain_timer = DrainTimer(async_engine, server_config.drain_timeout_s)
  server = DrainingServer(uvicorn_config, state.draining, drain_timer)
  stats_logger = StatsLogger(async_engine, state.metrics, server_config.stats_interval_s).start()
  previous = {sig: signal.signal(sig, _already_handled) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    server.run()
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    drain_timer.cancel()
    stats_logger.stop()
    async_engine.stop()
    state.executor.shutdown(wait=False)
    engine.runner.close()
  logger.info("stopped")
  return 0


def _parallel_overrides(args: argparse.Namespace) -> None:
  if args.distributed:
    args.overrides.append("distributed.enabled=true")
  for flag in ("coordinator_address", "num_processes", "process_id"):
    value = getattr(args, flag)
    if value is not None:
      args.overrides.append(f"distributed.{flag}={json.dumps(value)}")


def _already_handled(sig, frame) -> None:
  """uvicorn re-raises the stop signal after its graceful shutdown; the drain has happened."""
