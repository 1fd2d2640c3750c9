"""One HTTP call's engine requests: expansion into choices, SSE streaming and collecting.

Prompts x n become engine core requests (engine/core_io.new_core_requests: each prompt's ids
checked once and shared by its choices) whose position is the OpenAI choice index (prompt-major,
as OpenAI numbers batch choices), each prompt's n children from SamplingParams.expand_n.

Disconnects: a streaming response runs the SSE writer beside a listener for `http.disconnect`
(Starlette's StreamingResponse on ASGI spec 2.3); whatever ends the response, its requests are
aborted afterwards. A non-streaming call waits for its outputs and for `http.disconnect` on the
receive channel at once, and aborts when the client goes first. Either way the abort reaches the
engine core before its next step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from jaxserve.api.outputs import RequestOutput
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.core.streams import OutputStream, now
from jaxserve.engine.core_io import EngineCoreRequest, new_core_requests
from jaxserve.server.metrics import ServerMetrics

DONE_EVENT = "data: [DONE]\n\n"


class ClientDisconnected(Exception):
  """The client went away before the response was ready."""


def sse_event(data: dict) -> str:
  return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def expand_requests(
  response_id: str,
  prompts: Sequence[Sequence[int]],
  params: SamplingParams,
  vocab_size: int,
  priority: int = 0,
) -> list[EngineCoreRequest]:
  """One record per choice; record i is choice i. A prompt's bad ids are a ValueError naming
  `prompt` (`prompt[k]` of several). priority: the body's (vLLM's field)."""
  arrival = now()
  children = params.expand_n()
  records: list[EngineCoreRequest] = []
  for k, ids in enumerate(prompts):
    first = len(records)
    records += new_core_requests(
      [f"{response_id}-{first + j}" for j in range(len(children))],
      ids,
      children,
      vocab_size,
      arrival_time=arrival,
      priority=priority,
      field="prompt" if len(prompts) == 1 else f"prompt[{k}]",
    )
  return records


class EngineStreamResponse(StreamingResponse):
  """An SSE response that aborts its engine requests when it ends, however it ends."""

  def __init__(self, events: AsyncIterator[str], stream: OutputStream, metrics: ServerMetrics):
    super().__init__(
      events,
      media_type="text/event-stream",
      headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    self._stream = stream
    self._metrics = metrics

  async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
    try:
      await super().__call__(scope, receive, send)
    finally:
      aborted = self._metrics.for_engine(self._stream.engine_index).requests_aborted
      aborted.inc(self._stream.abort())


async def collect(
  stream: OutputStream, receive: Receive, metrics: ServerMetrics
) -> dict[str, RequestOutput]:
  """Every request's final output; raises ClientDisconnected (after aborting) if the client
  leaves first, EngineDeadError if the engine dies."""
  observe = metrics.observer(stream.engine_index)

  async def consume() -> dict[str, RequestOutput]:
    finals = {}
    while not stream.finished:
      output = await stream.get()
      observe(output)
      if output.finished:
        finals[output.request_id] = output
    return finals

  async def watch() -> None:
    while (await receive())["type"] != "http.disconnect":
      pass

  consumer = asyncio.ensure_future(consume())
  watcher = asyncio.ensure_future(watch())
  try:
    await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if consumer.done():
      return consumer.result()
    raise ClientDisconnected()
  finally:
    consumer.cancel()
    watcher.cancel()
    metrics.for_engine(stream.engine_index).requests_aborted.inc(stream.abort())
