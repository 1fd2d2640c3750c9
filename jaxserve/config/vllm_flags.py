"""vLLM's `serve` flags that jaxserve takes so vLLM command lines run unchanged, each mapped
onto what it means here (engine flags with a meaning live in jaxserve/config/engine_args.py):

* --max-logprobs N: server.max_logprobs, the most logprobs / top_logprobs a request may ask for
  (at most 20, what the sampler computes; vLLM's default is 20 too).
* --disable-log-stats: server.stats_interval_s 0 (no periodic stats line).
* --enable-auto-tool-choice: tool_choice "auto" reads tool calls with --tool-call-parser, which
  jaxserve does whenever a parser is set; as in vLLM, the flag without a parser is an error.
* --disable-log-requests (and vLLM's newer --enable-log-requests): accepted, a log line says
  they change nothing (jaxserve logs no request contents).
* --ssl-keyfile / --ssl-certfile: server.ssl_keyfile / server.ssl_certfile, HTTPS (uvicorn's).
* --h11-max-incomplete-event-size N: server.h11_max_incomplete_event_size, the most bytes of a
  request head buffered before it is complete (h11's default, 16 KiB, where vLLM's is 4 MiB: a
  head that large is no API client's).
* --uvicorn-log-level LEVEL: server.uvicorn_log_level, uvicorn's loggers' level (vLLM's
  choices; default: the command's --log-level).
* --disable-uvicorn-access-log: server.uvicorn_access_log false, no line per request.

* --default-chat-template-kwargs JSON: server.default_chat_template_kwargs, template variables
  every chat rendering gets under a request's own chat_template_kwargs (e.g.
  '{"enable_thinking": false}').

The engine's vLLM flags (`--max-model-len 32K`, `-tp 2`, `--revision`, `--enforce-eager`, ...)
are every command's: jaxserve/config/engine_args.py and jaxserve/config/inert_args.py.
"""

from __future__ import annotations

import argparse
import json
import logging

from jaxserve.config.server import UVICORN_LOG_LEVELS

logger = logging.getLogger(__name__)

NO_OP_FLAGS = {
  "disable_log_requests": "jaxserve logs no request contents",
  "enable_log_requests": "jaxserve logs no request contents",
}


def add_vllm_flags(group: argparse._ArgumentGroup) -> None:
  group.add_argument(
    "--max-logprobs",
    type=int,
    help="the most logprobs / top_logprobs a request may ask for, 0 to 20 (config key "
    "server.max_logprobs; default: 20)",
  )
  group.add_argument(
    "--disable-log-stats",
    action="store_true",
    help="no periodic stats line (sets server.stats_interval_s to 0)",
  )
  group.add_argument(
    "--enable-auto-tool-choice",
    action="store_true",
    help='tool_choice "auto" reads tool calls with --tool-call-parser (required with it); '
    "jaxserve does so whenever a parser is set",
  )
  for name, why in NO_OP_FLAGS.items():
    group.add_argument("--" + name.replace("_", "-"), action="store_true", help=f"accepted; {why}")
  group.add_argument(
    "--ssl-keyfile",
    metavar="FILE",
    help="the TLS private key (PEM) of --ssl-certfile, when it is not in that file "
    "(server.ssl_keyfile; default: unset)",
  )
  group.add_argument(
    "--ssl-certfile",
    metavar="FILE",
    help="serve HTTPS with this certificate (PEM; server.ssl_certfile; default: unset, HTTP)",
  )
  group.add_argument(
    "--h11-max-incomplete-event-size",
    type=int,
    metavar="BYTES",
    help="the most bytes of a request head buffered before it is complete; a head still "
    "incomplete past that gets 400 (server.h11_max_incomplete_event_size; default: 16384, "
    "h11's)",
  )
  group.add_argument(
    "--uvicorn-log-level",
    choices=UVICORN_LOG_LEVELS,
    help="uvicorn's loggers' level (server.uvicorn_log_level; default: --log-level's)",
  )
  group.add_argument(
    "--disable-uvicorn-access-log",
    action="store_true",
    help="no uvicorn line per request (sets server.uvicorn_access_log to false)",
  )
  group.add_argument(
    "--default-chat-template-kwargs",
    metavar="JSON",
    help="template variables every chat rendering gets, a JSON object, under a request's own "
    "chat_template_kwargs, e.g. '{\"enable_thinking\": false}' "
    "(server.default_chat_template_kwargs; default: none)",
  )


PASS_THROUGH = ("ssl_keyfile", "ssl_certfile", "h11_max_incomplete_event_size", "uvicorn_log_level")


def vllm_flag_overrides(args: argparse.Namespace) -> list[str]:
  """The config overrides the vLLM flags stand for (logging what they change nothing of);
  ValueError for --enable-auto-tool-choice without --tool-call-parser."""
  overrides = []
  if args.max_logprobs is not None:
    overrides.append(f"server.max_logprobs={json.dumps(args.max_logprobs)}")
  if args.disable_log_stats:
    overrides.append("server.stats_interval_s=0")
  if args.disable_uvicorn_access_log:
    overrides.append("server.uvicorn_access_log=false")
  if args.default_chat_template_kwargs is not None:
    try:
      kwargs = json.loads(args.default_chat_template_kwargs)
    except json.JSONDecodeError as err:
      raise ValueError(f"--default-chat-template-kwargs: not valid JSON: {err}") from err
    overrides.append(f"server.default_chat_template_kwargs={json.dumps(kwargs)}")
  for name in PASS_THROUGH:
    value = getattr(args, name)
    if value is not None:
      overrides.append(f"server.{name}={json.dumps(value)}")
  if args.enable_auto_tool_choice:
    if args.tool_call_parser is None:
      raise ValueError(
        "--enable-auto-tool-choice: needs --tool-call-parser (as in vLLM), e.g. llama3_json"
      )
    logger.info(
      'enable_auto_tool_choice: tool_choice "auto" reads tool calls with the %s parser',
      args.tool_call_parser,
    )
  for name, why in NO_OP_FLAGS.items():
    if getattr(args, name):
      logger.info("%s: accepted, changes nothing: %s", name, why)
  return overrides
