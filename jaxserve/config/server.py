"""The HTTP server's configuration (`server:` in a config file): a frozen dataclass validated with
exceptions, one field of EngineConfig (jaxserve/config/engine.py, which loads it). This module
imports nothing from jax.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxserve.api.sampling_params import MAX_LOGPROBS
from jaxserve.config.require import is_int_at_least, require_bool
from jaxserve.config.require import require as _require
from jaxserve.reasoning import reasoning_parser_names
from jaxserve.structured.tool_parsers import tool_parser_names

# uvicorn's log levels (vLLM's --uvicorn-log-level choices)
UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True)
class ServerConfig:
  """The HTTP server. served_model_name: the model names requests may send (a name or a list,
  vLLM's `--served-model-name a b`; held as a tuple): the first is the `model` of every response
  and of the metrics' labels, /v1/models lists each (model_names(); null: the model itself).
  uvicorn_log_level: uvicorn's own loggers' level (null: the command's --log-level);
  uvicorn_access_log: uvicorn's line per request (vLLM's --disable-uvicorn-access-log sets it
  false). max_waiting_requests counts HTTP requests admitted and not yet started,
  whatever their n (the engine core counts them, core/loop.py); max_n caps a request's n
  (larger is a 400); stream_interval: a streamed choice gets a chunk every that many engine
  steps that produced its tokens (its first and last always at once; server/stream_interval.py).
  api_server_count: HTTP front-end processes beside the engine core process (null: one per 4
  CPU cores, at most 4, at least 1; core/supervisor.py); 0 serves from one process, the engine
  core on a thread (core/in_process.py). tool_call_parser: how tool calls are read from a chat
  reply under tool_choice "auto" (vLLM's names: llama3_json, hermes; None: replies stay
  content). reasoning_parser: how a chat reply's reasoning is split from its content into
  `reasoning_content` (vLLM's names: qwen3, deepseek_r1; jaxserve/reasoning; None: it stays
  content). default_chat_template_kwargs: variables every chat template rendering gets, under
  a request's own chat_template_kwargs (vLLM's --default-chat-template-kwargs).
  max_logprobs: the most logprobs / top_logprobs a request may ask for (vLLM's
  --max-logprobs; at most 20, what the sampler computes).

  Connections (server/http_protocol.py, server/uvicorn_runner.py): stream_stall_timeout_s: a
  client that takes nothing of a response for that long while the server has output waiting for
  it is disconnected and its requests aborted (0: never). ssl_keyfile / ssl_certfile: serve
  HTTPS (uvicorn's TLS; the key may be in the certificate file). limit_concurrency: per API
  server, past this many open connections or running requests a request gets 503 (null: no
  cap). timeout_keep_alive_s: an idle keep-alive connection is closed after that long.
  h11_max_incomplete_event_size: the most bytes of a request head (request line and headers)
  buffered before it is complete; a head still incomplete past that gets 400. header_timeout_s:
  a request head that has not fully arrived that long after the connection opened (or its
  previous response ended) closes the connection (0: never)."""

  host: str = "127.0.0.1"
  port: int = 8000
  api_key: str | None = None
  served_model_name: str | tuple[str, ...] | None = None
  max_waiting_requests: int = 1024
  max_n: int = 128
  stream_interval: int = 1
  max_body_bytes: int = 4 * 1024 * 1024
  drain_timeout_s: float = 30.0
  stats_interval_s: float = 10.0
  api_server_count: int | None = None
  tool_call_parser: str | None = None
  reasoning_parser: str | None = None
  default_chat_template_kwargs: dict | None = None
  max_logprobs: int = MAX_LOGPROBS
  stream_stall_timeout_s: float = 30.0
  ssl_keyfile: str | None = None
  ssl_certfile: str | None = None
  limit_concurrency: int | None = None
  timeout_keep_alive_s: float = 5.0
  h11_max_incomplete_event_size: int = 16 * 1024
  header_timeout_s: float = 30.0
  uvicorn_log_level: str | None = None
  uvicorn_access_log: bool = True

  def __post_init__(self) -> None:
    self._check_names_and_logs()
    self._check_connection_settings()
    _require(
      isinstance(self.max_logprobs, int)
      and not isinstance(self.max_logprobs, bool)
      and 0 <= self.max_logprobs <= MAX_LOGPROBS,
      "server.max_logprobs",
      f"must be an integer in [0, {MAX_LOGPROBS}] (the sampler computes at most "
      f"{MAX_LOGPROBS}), got {self.max_logprobs!r}",
    )
    _require(
      is_int_at_least(self.api_server_count, 0, optional=True),
      "server.api_server_count",
      f"must be null or an integer >= 0, got {self.api_server_count!r}",
    )
    if self.tool_call_parser is not None:
      _require(
        self.tool_call_parser in tool_parser_names(),
        "server.tool_call_parser",
        f"must be one of {', '.join(tool_parser_names())}, got {self.tool_call_parser!r}",
      )
    if self.reasoning_parser is not None:
      _require(
        self.reasoning_parser in reasoning_parser_names(),
        "server.reasoning_parser",
        f"must be one of {', '.join(reasoning_parser_names())}, got {self.reasoning_parser!r}",
      )
    kwargs = self.default_chat_template_kwargs
    _require(
      kwargs is None or (isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)),
      "server.default_chat_template_kwargs",
      f"must be null or a mapping of template variable names to values, got {kwargs!r}",
    )
    for name in ("max_n", "stream_interval"):
      value = getattr(self, name)
      _require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 1,
        f"server.{name}",
        f"must be an integer >= 1, got {value!r}",
      )
    _require(
      isinstance(self.stats_interval_s, (int, float)) and self.stats_interval_s >= 0,
      "server.stats_interval_s",
      f"must be a number >= 0 (0 disables the stats line), got {self.stats_interval_s!r}",
    )
    _require(
      isinstance(self.port, int) and 0 <= self.port < 65536,
      "server.port",
      f"must be in [0, 65535], got {self.port!r}",
    )
    _require(
      isinstance(self.max_waiting_requests, int) and self.max_waiting_requests >= 1,
      "server.max_waiting_requests",
      f"must be >= 1, got {self.max_waiting_requests!r}",
    )
    _require(
      isinstance(self.max_body_bytes, int) and self.max_body_bytes >= 1024,
      "server.max_body_bytes",
      f"must be >= 1024, got {self.max_body_bytes!r}",
    )
    _require(float(self.drain_timeout_s) >= 0, "server.drain_timeout_s", "must be >= 0")

  def model_names(self, model: str) -> tuple[str, ...]:
    """The names requests may send for the model called `model`, the served one first."""
    return self.served_model_name or (model,)

  def _check_names_and_logs(self) -> None:
    given = self.served_model_name
    names = (given,) if isinstance(given, str) else given
    names = tuple(names) if isinstance(names, list) else names
    _require(
      given is None
      or (
        isinstance(names, tuple)
        and len(names) > 0
        and all(isinstance(name, str) and name.strip() != "" for name in names)
      ),
      "server.served_model_name",
      f"must be null, a name or a non-empty list of names, got {given!r}",
    )
    object.__setattr__(self, "served_model_name", names)
    _require(
      self.uvicorn_log_level is None or self.uvicorn_log_level in UVICORN_LOG_LEVELS,
      "server.uvicorn_log_level",
      f"must be null or one of {', '.join(UVICORN_LOG_LEVELS)}, got {self.uvicorn_log_level!r}",
    )
    require_bool(self.uvicorn_access_log, "server.uvicorn_access_log")

  def _check_connection_settings(self) -> None:
    for name in ("stream_stall_timeout_s", "header_timeout_s"):
      value = getattr(self, name)
      _require(
        isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
        f"server.{name}",
        f"must be a number of seconds >= 0 (0 disables it), got {value!r}",
      )
    keep_alive = self.timeout_keep_alive_s
    _require(
      isinstance(keep_alive, (int, float)) and not isinstance(keep_alive, bool) and keep_alive > 0,
      "server.timeout_keep_alive_s",
      f"must be a number of seconds > 0, got {keep_alive!r}",
    )
    _require(
      is_int_at_least(self.limit_concurrency, 1, optional=True),
      "server.limit_concurrency",
      f"must be null (no cap) or an integer >= 1, got {self.limit_concurrency!r}",
    )
    size = self.h11_max_incomplete_event_size
    _require(
      isinstance(size, int) and not isinstance(size, bool) and size >= 1024,
      "server.h11_max_incomplete_event_size",
      f"must be an integer >= 1024 (bytes), got {size!r}",
    )
    for name in ("ssl_keyfile", "ssl_certfile"):
      value = getattr(self, name)
      _require(
        value is None or (isinstance(value, str) and value != ""),
        f"server.{name}",
        f"must be null or a file path, got {value!r}",
      )
    _require(
      self.ssl_keyfile is None or self.ssl_certfile is not None,
      "server.ssl_keyfile",
      "needs server.ssl_certfile (--ssl-certfile): the certificate to serve with the key",
    )
