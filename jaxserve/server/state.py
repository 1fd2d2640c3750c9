"""What every handler shares: the engine, tokenizer, server settings, metrics and the drain flag.

Admission order for a generation request: parse and validate the body (400; `n` above
server.max_n too), check the model (404), refuse while draining or after the engine died (503),
take a place among the waiting requests (429; server/admission.py), and only then tokenize, in
a thread pool so the event loop never blocks on it. Over the engine core process the place is
counted by the core when the tokenized requests arrive there (core/loop.py): a 429 then
comes after tokenizing, and the limit holds for every API server process together.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Mapping, TypeVar

from starlette.requests import Request

from jaxserve.config import ServerConfig
from jaxserve.server.admission import Place
from jaxserve.core.streams import EngineClient
from jaxserve.server.errors import ApiError, not_found, queue_full, unavailable
from jaxserve.server.metrics import ServerMetrics
from jaxserve.tokenizer.tokenizer import Tokenizer

T = TypeVar("T")


@dataclass
class ServingState:
  engine: EngineClient
  tokenizer: Tokenizer
  config: ServerConfig
  model_name: str
  max_model_len: int
  vocab_size: int
  metrics: ServerMetrics
  created: int = field(default_factory=lambda: int(time.time()))
  draining: threading.Event = field(default_factory=threading.Event)
  executor: ThreadPoolExecutor = field(
      default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="jaxserve-tokenize"))

  @property
  def ready(self) -> bool:
    return self.engine.alive and not self.draining.is_set()

  def check_model(self, body: Mapping) -> None:
    model = body.get("model")
    if model is not None and model != self.model_name:
      raise not_found(f"The model `{model}` does not exist; this server serves "
                      f"`{self.model_name}`.", param="model", code="model_not_found")

  def check_n(self, n: int) -> None:
    """`n` above server.max_n can never be served: a ValueError naming n (a 400, not a 429)."""
    if n > self.config.max_n:
      raise ValueError(f"n: must be <= {self.config.max_n} (server.max_n), got {n}")

  @contextlib.asynccontextmanager
  async def admit(self) -> AsyncIterator[Place]:
    """One place among the waiting requests for this HTTP call; pass it to engine.add(), whose
    stream gives it back when the call's requests have started (or, over the engine core
    process, which takes it then: add() raises the 429). Given back here if the block raises."""
    if self.draining.is_set():
      raise unavailable("the server is shutting down")
    if not self.engine.alive:
      raise unavailable("the engine has stopped")
    place = self.engine.try_admit(self.config.max_waiting_requests)
    if place is None:
      raise queue_full(self.config.max_waiting_requests)
    try:
      yield place
    except BaseException:
      place.release()
      raise

  async def run_blocking(self, fn: Callable[..., T], *args) -> T:
    return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

  def encode(self, text: str) -> list[int]:
    return self.tokenizer.encode(text)


async def read_json(request: Request) -> dict:
  """The body as a JSON object, or a 400."""
  raw = await request.body()
  try:
    body = json.loads(raw)
  except (UnicodeDecodeError, json.JSONDecodeError) as err:
    raise ApiError(400, f"the body is not valid JSON: {err}") from err
  if not isinstance(body, dict):
    raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
  return body
