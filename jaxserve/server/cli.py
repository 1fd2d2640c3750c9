"""`jaxserve serve`: build and warm up the engine, then serve the OpenAI-compatible API.

This module parses the flags (config/serve_flags.py owns them) and hands the configuration and the
API server's entry point (server/api_process.py) to core/serve.py, which starts what serves: by
default the engine in its own process and N API server processes (server.api_server_count /
--api-server-count; core/supervisor.py supervises them); with 0, one process, the engine core on a
thread (core/in_process.py). Either way the API servers talk to the engine core over ZeroMQ, and the
engine is built (model, buckets, KV pages, warmup; jaxserve/composition/assembly.py logs each)
before the HTTP socket opens, so once the server accepts connections /health is 200.

SIGTERM or SIGINT drains (server/uvicorn_runner.py): new requests (and /health) get 503, running
responses get up to server.drain_timeout_s to finish, those still running then end with an error
event and [DONE] (server/drain.py); the process (the supervisor: once every process has stopped)
exits with status 0.

Multi-host: every host runs `jaxserve serve` with the same settings plus its --process-id (or
--distributed alone on a Cloud TPU VM, where JAX finds the slice's hosts). All of them join the
jax.distributed job first; process 0 then builds the engine and serves HTTP, the others run the
worker loop (jaxserve/entrypoints/follower.py) and exit 0 after process 0 stops.
"""

from __future__ import annotations

import argparse

from jaxserve.config.serve_flags import add_serve_flags, serve_engine_config
from jaxserve.config.subcommands import Subcommand
from jaxserve.core.serve import serve as serve_config
from jaxserve.server.api_process import run_api_server
from jaxserve.server.tls import check_tls_files


def serve(args: argparse.Namespace) -> int:
  config = serve_engine_config(args)
  check_tls_files(config.server)  # before minutes of engine start-up
  return serve_config(config, args.log_level, run_api_server)


SERVE = Subcommand(
  "serve",
  help="serve the OpenAI-compatible HTTP API",
  description="Serve /v1/completions, /v1/chat/completions, /v1/models, /tokenize, "
  "/detokenize, /tokenizer_info, /health and /metrics. Without a MODEL it serves tiny-random.",
  add_flags=add_serve_flags,
  run=serve,
)
