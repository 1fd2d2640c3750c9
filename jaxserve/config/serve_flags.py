"""The flags of `jaxserve serve` beyond the engine's (config/cli_args.py): the server's
(`--host`, `--port`, `--api-key`, `--served-model-name`, `--api-server-count`, the connection
timeouts and limits, the tool-call and reasoning parsers), vLLM's serve flags
(config/vllm_flags.py) and the multi-host job's (`--distributed`, `--coordinator-address`,
`--num-processes`, `--process-id`), each mapped onto its config key (server.*, distributed.*) as
a `--set` override, so a flag, a YAML key and a `--set` are one setting. server/cli.py adds them
to its parser and runs the configuration serve_engine_config builds.
"""

from __future__ import annotations

import argparse
import json

from jaxserve.config import EngineConfig, ServerConfig
from jaxserve.config.cli_args import add_engine_args, engine_config_from_args
from jaxserve.config.vllm_flags import add_vllm_flags, vllm_flag_overrides
from jaxserve.reasoning import reasoning_parser_names
from jaxserve.structured.tool_parsers import tool_parser_names


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
  """The engine's flags, then the server's, vLLM's serve flags and the multi-host job's."""
  parser.add_argument(
    "model_tag",
    nargs="?",
    metavar="MODEL",
    help="the model to serve, as --model (default: tiny-random)",
  )
  add_engine_args(parser)
  group = parser.add_argument_group("server")
  group.add_argument("--host", help="address to bind (default 127.0.0.1)")
  group.add_argument("--port", type=int, help="port to bind (default 8000)")
  group.add_argument(
    "--api-key", help="require `Authorization: Bearer KEY` on the /v1 routes (as vLLM)"
  )
  group.add_argument(
    "--served-model-name",
    nargs="+",
    metavar="NAME",
    help="the model names requests may send (several: the first is the one responses carry, "
    "as in vLLM); /v1/models lists each (server.served_model_name; default: --model)",
  )
  group.add_argument(
    "--api-server-count",
    type=int,
    help="HTTP front-end processes beside the engine core process (default: one "
    "per 4 CPU cores, 1 to 4); 0 serves from one process, the engine core on a "
    "thread",
  )
  _add_connection_flags(group)
  group.add_argument(
    "--tool-call-parser",
    choices=tool_parser_names(),
    help="read tool calls from chat replies under tool_choice auto in this "
    "chat format (llama3_json: Llama 3.x; hermes: Hermes / Qwen <tool_call>)",
  )
  group.add_argument(
    "--reasoning-parser",
    choices=reasoning_parser_names(),
    help="split a chat reply's <think> reasoning from its content into reasoning_content "
    "(qwen3: Qwen3, a reply that opens the tag; deepseek_r1: DeepSeek-R1, reasoning until the "
    "closing tag)",
  )
  add_vllm_flags(parser.add_argument_group("vLLM compatibility (config/vllm_flags.py)"))
  group = parser.add_argument_group("parallel")
  group.add_argument(
    "--distributed",
    action="store_true",
    help="join a multi-host jax.distributed job (auto-detected on Cloud TPU VMs)",
  )
  group.add_argument("--coordinator-address", help="HOST:PORT of process 0's coordinator")
  group.add_argument("--num-processes", type=int, help="number of hosts in the job")
  group.add_argument("--process-id", type=int, help="this host's index, 0 serves HTTP")


# flag (argparse dest) -> server config key, where the two differ
CONNECTION_FLAGS = {
  "stream_stall_timeout": "stream_stall_timeout_s",
  "header_timeout": "header_timeout_s",
  "timeout_keep_alive": "timeout_keep_alive_s",
  "limit_concurrency": "limit_concurrency",
}


def _add_connection_flags(group: argparse._ArgumentGroup) -> None:
  defaults = ServerConfig()
  group.add_argument(
    "--stream-stall-timeout",
    type=float,
    metavar="SECONDS",
    help="disconnect a client that takes nothing of its response for this long while output "
    "waits for it, and abort its requests (config key server.stream_stall_timeout_s; 0 never; "
    f"default: {defaults.stream_stall_timeout_s:g})",
  )
  group.add_argument(
    "--header-timeout",
    type=float,
    metavar="SECONDS",
    help="close a connection whose request head has not fully arrived this long after it "
    "opened or its last response ended (server.header_timeout_s; 0 never; default: "
    f"{defaults.header_timeout_s:g})",
  )
  group.add_argument(
    "--timeout-keep-alive",
    type=float,
    metavar="SECONDS",
    help="close an idle keep-alive connection after this long (uvicorn's flag; "
    f"server.timeout_keep_alive_s; default: {defaults.timeout_keep_alive_s:g})",
  )
  group.add_argument(
    "--limit-concurrency",
    type=int,
    metavar="N",
    help="per API server process, answer 503 to a request that arrives while more than N "
    "connections are open or more than N requests run (uvicorn's flag; "
    "server.limit_concurrency; default: no cap)",
  )


def serve_engine_config(args: argparse.Namespace) -> EngineConfig:
  """The configuration `jaxserve serve` runs with: the engine flags, then the server's."""
  for flag in (
    "host",
    "port",
    "api_key",
    "served_model_name",
    "api_server_count",
    "tool_call_parser",
    "reasoning_parser",
  ):
    value = getattr(args, flag)
    if value is not None:
      args.overrides.append(f"server.{flag}={json.dumps(value)}")
  for flag, key in CONNECTION_FLAGS.items():
    value = getattr(args, flag)
    if value is not None:
      args.overrides.append(f"server.{key}={json.dumps(value)}")
  args.overrides.extend(vllm_flag_overrides(args))
  _parallel_overrides(args)
  return engine_config_from_args(args)


def _parallel_overrides(args: argparse.Namespace) -> None:
  if args.distributed:
    args.overrides.append("distributed.enabled=true")
  for flag in ("coordinator_address", "num_processes", "process_id"):
    value = getattr(args, flag)
    if value is not None:
      args.overrides.append(f"distributed.{flag}={json.dumps(value)}")
