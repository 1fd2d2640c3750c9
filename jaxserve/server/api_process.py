"""An API server process: Starlette + uvicorn over a CoreClient, on the supervisor's listening
socket (several such processes accept from one socket; the kernel spreads the connections).

It tokenizes, applies chat templates, detokenizes, applies stop strings and writes JSON and SSE;
it never imports jax. The tokenizer and the model's limits come from the core (CoreInfo).
"""
from __future__ import annotations

import gc
import signal
import socket

from jaxserve.config import ServerConfig
from jaxserve.server.core_process import CoreInfo


def run_api_server(config: ServerConfig, info: CoreInfo, address: str, sock: socket.socket,
                   index: int, log_level: str) -> None:
  """The child's entry point (multiprocessing spawn)."""
  from jaxserve.log_setup import configure_logging
  from jaxserve.server.app import build_app
  from jaxserve.server.core_client import CoreClient
  from jaxserve.server.uvicorn_runner import run_app

  configure_logging(log_level)
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor forwards the stop as SIGTERM
  client = CoreClient(address, info.tokenizer, identity=f"api-{index}")
  app = build_app(client, info.tokenizer, config, model_name=info.model_name,
                  max_model_len=info.max_model_len, vocab_size=info.vocab_size)
  gc.collect()
  gc.freeze()  # the app's long-lived objects: later collections do not scan them
  run_app(app, config, log_level, sock=sock, stats_prefix=f"API server {index}: ")
