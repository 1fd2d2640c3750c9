"""How `jaxserve serve` runs, once its flags are parsed (server/cli.py): which processes serve.

* Multi-host (config.distributed.active): every host joins the jax.distributed job first;
  process 0 then builds the engine in this process and serves it from this process
  (core/in_process.py), the others run the worker loop (jaxserve/entrypoints/follower.py) and exit 0
  after process 0 stops.
* server.api_server_count N > 0 (default: default_api_server_count()): the supervisor
  (core/supervisor.py) starts the engine core process and N API server processes; this process
  never touches jax.
* server.api_server_count 0: one process, the engine core on a thread (core/in_process.py).

`entry` is the API server (server/api_process.py's run_api_server): core/ starts processes and
threads and never imports server/; server/ serves HTTP and starts nothing.
"""

from __future__ import annotations

from jaxserve.config import EngineConfig
from jaxserve.core.in_process import serve_in_process
from jaxserve.core.info import ApiServerEntry
from jaxserve.core.supervisor import default_api_server_count, serve_multiprocess


def serve(config: EngineConfig, log_level: str, entry: ApiServerEntry) -> int:
  """Serves until a stop signal has drained every API server; the exit status."""
  if config.distributed.active:
    return _serve_multihost(config, log_level, entry)
  count = config.server.api_server_count
  if count is None:
    count = default_api_server_count()
  if count > 0:
    return serve_multiprocess(config, count, log_level, entry)
  return serve_in_process(config, log_level, entry)


def _serve_multihost(config: EngineConfig, log_level: str, entry: ApiServerEntry) -> int:
  from jaxserve.parallel.multihost import initialize_distributed, is_worker

  initialize_distributed(config.distributed)
  if is_worker():
    from jaxserve.entrypoints.follower import run_follower

    return run_follower(config)
  return serve_in_process(config, log_level, entry)
