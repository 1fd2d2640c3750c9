"""What every handler shares: the engine, tokenizer, server settings, metrics and the drain flag.

Admission order for a generation request: parse and validate the body (400; `n` above
server.max_n too), check the model (404), refuse while draining or once the engine core is gone
(503: check_serving), tokenize in a thread pool so the event loop never blocks on it (a prompt
too long for the context refused before it is tokenized in full: server/prompt_length.py), and add
the requests (add): the engine core counts the HTTP requests waiting to start, for every API
server together (core/loop.py), and refuses past server.max_waiting_requests (429).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from jaxserve.config import ServerConfig
from jaxserve.config.generation_config import GenerationDefaults
from jaxserve.core.dp_client import EngineClient
from jaxserve.core.streams import OutputStream, QueueFullError
from jaxserve.engine.core_io import EngineCoreRequest
from jaxserve.server.errors import not_found, queue_full, unavailable
from jaxserve.server.metrics import ServerMetrics
from jaxserve.tokenizer.tokenizer import Tokenizer

T = TypeVar("T")


@dataclass
class ServingState:
  engine: EngineClient
  tokenizer: Tokenizer
  config: ServerConfig
  model_names: tuple[str, ...]  # what requests may send; the first is every response's model
  max_model_len: int
  vocab_size: int
  metrics: ServerMetrics
  generation_defaults: GenerationDefaults = GenerationDefaults()
  created: int = field(default_factory=lambda: int(time.time()))
  draining: threading.Event = field(default_factory=threading.Event)
  executor: ThreadPoolExecutor = field(
    default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="jaxserve-tokenize")
  )

  @property
  def ready(self) -> bool:
    return self.engine.alive and not self.draining.is_set()

  @property
  def model_name(self) -> str:
    """The served model's name in responses (the first of model_names, as vLLM's)."""
    return self.model_names[0]

  def check_model(self, body: Mapping) -> None:
    model = body.get("model")
    if model is not None and model not in self.model_names:
      served = ", ".join(f"`{name}`" for name in self.model_names)
      raise not_found(
        f"The model `{model}` does not exist; this server serves {served}.",
        param="model",
        code="model_not_found",
      )

  def check_n(self, n: int) -> None:
    """`n` above server.max_n can never be served: a ValueError naming n (a 400, not a 429)."""
    if n > self.config.max_n:
      raise ValueError(f"n: must be <= {self.config.max_n} (server.max_n), got {n}")

  def check_serving(self) -> None:
    """A 503 while draining or once the engine core is gone (before any work on the request)."""
    if self.draining.is_set():
      raise unavailable("the server is shutting down")
    if not self.engine.alive:
      raise unavailable("the engine has stopped")

  async def add(self, requests: list[EngineCoreRequest]) -> OutputStream:
    """One HTTP call's requests into the engine core: 429 if server.max_waiting_requests HTTP
    requests wait to start; ValueError (naming the field) if the core refuses one."""
    try:
      return await self.engine.add(requests, self.config.max_waiting_requests)
    except QueueFullError as err:
      raise queue_full(err.limit) from None

  async def run_blocking(self, fn: Callable[..., T], *args) -> T:
    return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
