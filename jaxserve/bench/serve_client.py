"""One client process of `jaxserve bench serve`: streams its requests over SSE and times chunks.

It loads /v1/completions (prompts as text or token ids) or /v1/chat/completions (each prompt one
user message) through one shared httpx.AsyncClient. Each request is sent at its offset from a
start time, after waiting for one of `concurrency` places when capped. Times are
time.monotonic() (CLOCK_MONOTONIC on Linux: the same clock in every process of the machine), so
several client processes (client_processes.py) follow one schedule from one start and their
records merge into one run. Every request asks for `stream_options.include_usage`, so output
token counts come from the server's usage; when a server reports none, the number of chunks
carrying choices is used instead. Timing follows vLLM's benchmark_serving (latency_stats.py):
TTFT from the request's send (after its place, when capped) to the first chunk with content, an
ITL per later content chunk, E2E to the last one.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import httpx  # the async streaming HTTP client (the `bench` extra; checked by tools/cli.py)

from jaxserve.bench.datasets import SampleRequest
from jaxserve.bench.gc_pause import no_cycle_collection
from jaxserve.bench.latency_stats import RequestRecord

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class ServeBenchConfig:
  base_url: str
  model: str
  request_rate: float = math.inf
  burstiness: float = 1.0
  max_concurrency: int | None = None
  ignore_eos: bool = False
  seed: int = 0
  api_key: str | None = None
  timeout_s: float = 600.0
  endpoint: str = COMPLETIONS_PATH
  show_progress: bool = False


@dataclass(frozen=True)
class ClientRun:
  """What one client process saw: its records (start_time from the shared start) and when its
  last request ended (time.monotonic())."""

  records: list[RequestRecord]
  end: float


def completion_payload(config: ServeBenchConfig, request: SampleRequest) -> dict:
  common = {
    "model": config.model,
    "temperature": 0.0,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": config.ignore_eos,
  }
  if config.endpoint == CHAT_PATH:
    if not isinstance(request.prompt, str):
      raise ValueError("random_prompt_type: chat prompts are text; use --random-prompt-type text")
    return {
      **common,
      "messages": [{"role": "user", "content": request.prompt}],
      "max_completion_tokens": request.expected_output_len,
    }
  prompt = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
  return {**common, "prompt": prompt, "max_tokens": request.expected_output_len}


def _content(choice: dict) -> str | None:
  """The text a completion or chat chunk's choice carries ("" for a token whose text is held
  back); None for a chat chunk that is not a token: the opening role chunk, or one with
  neither content nor a finish reason."""
  if "delta" in choice:
    delta = choice["delta"]
    if choice.get("finish_reason"):
      return delta.get("content") or ""
    if "role" in delta or delta.get("content") is None:
      return None
    return delta["content"]
  return choice.get("text", "")


async def send_request(
  client: httpx.AsyncClient, config: ServeBenchConfig, request: SampleRequest
) -> RequestRecord:
  """Streams one completion and times its chunks."""
  start = time.monotonic()
  ttft, last, itls, num_chunks, usage_tokens = None, start, [], 0, None
  base = dict(prompt_len=request.prompt_len, expected_output_len=request.expected_output_len)
  try:
    async with client.stream(
      "POST",
      config.base_url.rstrip("/") + config.endpoint,
      json=completion_payload(config, request),
    ) as response:
      if response.status_code != 200:
        body = (await response.aread()).decode(errors="replace")[:500]
        return RequestRecord(False, **base, error=f"HTTP {response.status_code}: {body}")
      async for line in response.aiter_lines():
        data = _sse_data(line)
        if data is None:
          continue
        if data == "[DONE]":
          break
        chunk = json.loads(data)
        now = time.monotonic()
        if chunk.get("choices") and _content(chunk["choices"][0]) is not None:
          if ttft is None:
            ttft = now - start
          else:
            itls.append(now - last)
          last, num_chunks = now, num_chunks + 1
        if chunk.get("usage"):
          usage_tokens = chunk["usage"].get("completion_tokens")
  except (httpx.HTTPError, json.JSONDecodeError) as err:
    return RequestRecord(False, **base, error=f"{type(err).__name__}: {err}")
  if ttft is None:
    return RequestRecord(False, **base, error="stream ended without a completion chunk")
  output_tokens = usage_tokens if usage_tokens is not None else num_chunks
  return RequestRecord(
    True,
    **base,
    output_tokens=int(output_tokens),
    ttft=ttft,
    e2e=last - start,
    itls=tuple(itls),
    start_time=start,
    usage_reported=usage_tokens is not None,
  )


def _sse_data(line: str) -> str | None:
  if not line.startswith("data:"):
    return None
  return line[len("data:") :].strip()


async def run_schedule(
  config: ServeBenchConfig,
  requests: Sequence[SampleRequest],
  offsets: Sequence[float],
  start: float,
  concurrency: int | None,
  on_done: Callable[[], None] | None = None,
) -> ClientRun:
  """Sends requests[i] at `start` + offsets[i] (time.monotonic() seconds), at most `concurrency`
  in flight; `on_done` is called as each one ends."""
  limit = asyncio.Semaphore(concurrency) if concurrency else None
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
  headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
  async with httpx.AsyncClient(
    timeout=httpx.Timeout(config.timeout_s), limits=limits, headers=headers
  ) as client:

    async def one(request: SampleRequest, offset: float) -> RequestRecord:
      await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
      if limit is None:
        record = await send_request(client, config, request)
      else:
        async with limit:
          record = await send_request(client, config, request)
      if on_done is not None:
        on_done()
      return record

    with no_cycle_collection():  # a full collection would hold every stream's chunks back
      records = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets, strict=True)))
    end = time.monotonic()
  return ClientRun([_relative(r, start) for r in records], end)


def _relative(record: RequestRecord, start: float) -> RequestRecord:
  if not record.success:
    return record
  return RequestRecord(**{**asdict(record), "start_time": record.start_time - start})
