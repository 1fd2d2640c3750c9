"""An API server: Starlette + uvicorn over a CoreClient connected to the engine core.

run_api_server is the entry point `jaxserve serve` hands to core/ (core/serve.py): each API
server process of the supervisor runs it on the supervisor's listening socket (several such
processes accept from one socket; the kernel spreads the connections), and the one-process
server runs it on its main thread beside the engine core's thread (no socket: it binds
server.host:port). It tokenizes, applies chat templates, detokenizes, applies stop strings and
writes JSON and SSE; it never imports jax. The tokenizer and the model's limits come from the
core (CoreInfo, core/info.py), read from the file core/ wrote it to.

The API server processes of one supervisor share their request metrics (server/metrics.py):
prometheus_client's multi-process mode, which it chooses when it is first imported, from the
PROMETHEUS_MULTIPROC_DIR environment variable; run_api_server sets it to the supervisor's
directory before anything imports prometheus_client in the process (checked).
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

from jaxserve.core.client import CoreClient
from jaxserve.core.dp_client import DataParallelClient, EngineClient
from jaxserve.core.info import ApiProcessArgs, CoreInfo, read_core_info
from jaxserve.runtime.gc_pauses import GcPauses


def run_api_server(args: ApiProcessArgs) -> None:
  """Serves until a stop signal has drained the app."""
  if args.metrics_dir is not None:
    if "prometheus_client" in sys.modules:
      raise RuntimeError("prometheus_client was imported before its multi-process mode was set")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = args.metrics_dir
  from jaxserve.server.app import build_app
  from jaxserve.server.sleep_routes import dev_mode
  from jaxserve.server.uvicorn_runner import run_app

  info = read_core_info(Path(args.info_path))
  client = engine_client(args, info)
  app = build_app(
    client,
    info.tokenizer,
    args.server_config,
    model_name=info.model_name,
    max_model_len=info.max_model_len,
    vocab_size=info.vocab_size,
    metrics_dir=args.metrics_dir,
    generation_defaults=info.generation_defaults,
    dev_mode=dev_mode(os.environ),
  )
  gc.collect()
  gc.freeze()  # the app's long-lived objects: later collections do not scan them
  gc_pause = app.state.serving.metrics.gc_pause
  pauses = GcPauses(lambda generation, s: gc_pause.labels(str(generation)).observe(s)).start()
  try:
    run_app(
      app,
      args.server_config,
      args.log_level,
      sock=args.sock,
      stats_prefix=f"API server {args.index}: " if args.sock is not None else "",
    )
  finally:
    pauses.close()


def engine_client(args: ApiProcessArgs, info: CoreInfo) -> EngineClient:
  """A CoreClient of the engine core, or a DataParallelClient over one per core when
  data_parallel_size cores serve (each client under this API server's identity)."""
  addresses = args.core_addresses
  clients = [
    CoreClient(address, info.tokenizer, identity=args.identity, engine_index=index)
    for index, address in enumerate(addresses)
  ]
  if len(clients) == 1:
    return clients[0]
  return DataParallelClient(clients, info.page_size)
