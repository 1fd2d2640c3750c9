"""One call of `jaxserve bench soak`: send a `SoakRequest` over a shared httpx.AsyncClient and
record what happened (`SoakRecord`).

A streamed call is read chunk by chunk: TTFT is the first chunk that carries a choice, TPOT the
rest of the stream over its further tokens (the usage's completion tokens when the server sends
them, else the chunks); a call that cancels leaves after `cancel_after` chunks (closing its
connection, as a client that goes away). A stream that ends with an error event, or whose
connection breaks, is `cut`. A bad input is checked for a 4xx whose body is OpenAI's error
object (`error_body_ok`). Times are time.monotonic().

`stalled_reader` is the stuck client (what a SIGSTOPped client process looks like to the
server): it sends a long streamed call over its own socket with a small receive window, reads
the response head, then reads nothing for `hold_s` seconds before it reads on; `cut` says the
server dropped it meanwhile (server.stream_stall_timeout_s), which frees its KV pages.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass

import httpx

from jaxserve.bench.soak_catalogue import SoakRequest

ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass(frozen=True)
class SoakRecord:
  """What one call saw. status 0: no HTTP status (the connection failed before one)."""

  kind: str
  start: float
  end: float
  status: int
  expect_4xx: bool = False
  error_body_ok: bool = False
  cut: bool = False
  cancelled: bool = False
  ttft: float | None = None
  tpot: float | None = None
  output_tokens: int = 0
  text: str = ""
  error: str = ""


async def send(client: httpx.AsyncClient, request: SoakRequest) -> SoakRecord:
  start = time.monotonic()
  base = dict(kind=request.kind, start=start, expect_4xx=request.expect_4xx)
  content = request.raw if request.raw is not None else json.dumps(request.body).encode()
  kwargs = {"content": content, "headers": {"content-type": "application/json"}}
  if request.method == "GET":
    kwargs = {}
  try:
    async with client.stream(request.method, request.path, **kwargs) as response:
      if response.status_code != 200 or not request.stream:
        body = await response.aread()
        return _answered(base, response.status_code, body)
      return await _streamed(base, request, response)
  except httpx.HTTPError as err:
    return SoakRecord(**base, end=time.monotonic(), status=0, cut=True, error=_describe(err))


def _answered(base: dict, status: int, body: bytes) -> SoakRecord:
  end = time.monotonic()
  try:
    data = json.loads(body)
  except ValueError:
    data = None
  error = data.get("error") if isinstance(data, dict) else None
  error_ok = isinstance(error, dict) and set(error) >= ERROR_KEYS and bool(error.get("message"))
  if status != 200:
    message = body[:300].decode(errors="replace")
    return SoakRecord(**base, end=end, status=status, error_body_ok=error_ok, error=message)
  text = ""
  if isinstance(data, dict) and data.get("choices"):
    choice = data["choices"][0]
    text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
  tokens = (data.get("usage") or {}).get("completion_tokens", 0) if isinstance(data, dict) else 0
  return SoakRecord(**base, end=end, status=status, output_tokens=tokens, text=text)


async def _streamed(base: dict, request: SoakRequest, response: httpx.Response) -> SoakRecord:
  chunks, first, usage_tokens, error = 0, None, None, ""
  async for line in response.aiter_lines():
    if not line.startswith("data:"):
      continue
    data = line[5:].strip()
    if data == "[DONE]":
      break
    chunk = json.loads(data)
    if "error" in chunk:
      error = json.dumps(chunk["error"])[:300]
      continue
    if chunk.get("choices"):
      chunks += 1
      first = first if first is not None else time.monotonic()
      if request.cancel_after is not None and chunks >= request.cancel_after:
        return SoakRecord(**base, end=time.monotonic(), status=200, cancelled=True)
    if chunk.get("usage"):
      usage_tokens = chunk["usage"].get("completion_tokens")
  end = time.monotonic()
  tokens = usage_tokens if usage_tokens is not None else chunks
  ttft = None if first is None else first - base["start"]
  tpot = (end - first) / (tokens - 1) if first is not None and tokens > 1 else None
  return SoakRecord(
    **base,
    end=end,
    status=200,
    cut=bool(error),
    ttft=ttft,
    tpot=tpot,
    output_tokens=tokens,
    error=error,
  )


def _describe(err: Exception) -> str:
  return f"{type(err).__name__}: {err}"[:300]


async def stalled_reader(host: str, port: int, request: SoakRequest, hold_s: float) -> SoakRecord:
  start = time.monotonic()
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
  sock.setblocking(False)
  body = json.dumps(request.body).encode()
  head = f"POST {request.path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
  try:
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
    writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    status = int((await reader.readline()).split()[1])
    await asyncio.sleep(hold_s)  # the client is stopped
    done = False
    while line := await reader.readline():
      done = done or line.strip() == b"data: [DONE]"
    writer.close()
  except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as err:
    sock.close()
    return SoakRecord("stalled", start, time.monotonic(), 200, cut=True, error=_describe(err))
  return SoakRecord("stalled", start, time.monotonic(), status, cut=not done)
