"""An API server process: Starlette + uvicorn over a CoreClient, on the supervisor's listening
socket (several such processes accept from one socket; the kernel spreads the connections).

It tokenizes, applies chat templates, detokenizes, applies stop strings and writes JSON and SSE;
it never imports jax. The tokenizer and the model's limits come from the core (CoreInfo), read
from the file the supervisor wrote it to: passed as an argument, a large tokenizer (1.6 MB
pickled for a 128k vocabulary) would fill the spawn pipe and make the supervisor's start() of
each process wait for that child's imports, so the processes would start one after another.
"""
from __future__ import annotations

import gc
import pickle
import signal
import socket
from pathlib import Path

from jaxserve.config import ServerConfig
from jaxserve.core.process import CoreInfo


def write_core_info(info: CoreInfo, path: Path) -> None:
  path.write_bytes(pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL))


def run_api_server(config: ServerConfig, info_path: str, address: str, sock: socket.socket,
                   index: int, log_level: str) -> None:
  """The child's entry point (multiprocessing spawn); info_path: write_core_info's file (written
  by the supervisor, a process of the same user)."""
  from jaxserve.log_setup import configure_logging
  from jaxserve.server.app import build_app
  from jaxserve.core.client import CoreClient
  from jaxserve.server.uvicorn_runner import run_app

  configure_logging(log_level)
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor forwards the stop as SIGTERM
  info: CoreInfo = pickle.loads(Path(info_path).read_bytes())
  client = CoreClient(address, info.tokenizer, identity=f"api-{index}")
  app = build_app(client, info.tokenizer, config, model_name=info.model_name,
                  max_model_len=info.max_model_len, vocab_size=info.vocab_size)
  gc.collect()
  gc.freeze()  # the app's long-lived objects: later collections do not scan them
  run_app(app, config, log_level, sock=sock, stats_prefix=f"API server {index}: ")
