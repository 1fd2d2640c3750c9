"""Many concurrent streams, and clients that leave: their requests are aborted and their KV pages
come back (read from /metrics)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.server.server_helpers import scrape_metrics, wait_for_idle

MODEL = "tiny-random"
PROMPTS = [f"Prompt number {i}: tell me" for i in range(8)]
MAX_TOKENS = 24


def _body(prompt: str, stream: bool, max_tokens: int = MAX_TOKENS) -> dict:
  return {
    "model": MODEL,
    "prompt": prompt,
    "max_tokens": max_tokens,
    "temperature": 0,
    "ignore_eos": True,
    "stream": stream,
  }


async def _stream_text(client: httpx.AsyncClient, prompt: str, stop_after: int | None) -> str:
  """The streamed text; with stop_after, closes the response after that many chunks."""
  parts = []
  async with client.stream("POST", "/v1/completions", json=_body(prompt, True)) as response:
    assert response.status_code == 200
    async for line in response.aiter_lines():
      if not line.startswith("data: ") or line == "data: [DONE]":
        continue
      parts.append(json.loads(line[6:])["choices"][0]["text"])
      if stop_after is not None and len(parts) >= stop_after:
        return "".join(parts)  # leaving the block closes the connection mid-stream
  return "".join(parts)


def test_64_streams_match_non_streamed_and_cancelled_half_frees_everything(served):
  expected = {}
  with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0) as client:
    for prompt in PROMPTS:
      reply = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
      )
      expected[prompt] = reply.choices[0].text

  async def run() -> list[tuple[str, int | None, str]]:
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=served.url, timeout=60, limits=limits) as client:
      jobs = [(PROMPTS[i % len(PROMPTS)], 3 if i % 2 else None) for i in range(64)]
      texts = await asyncio.gather(*(_stream_text(client, p, s) for p, s in jobs))
    return [(p, s, t) for (p, s), t in zip(jobs, texts, strict=True)]

  results = asyncio.run(run())
  for prompt, stop_after, text in results:
    if stop_after is None:
      assert text == expected[prompt]
    else:
      assert expected[prompt].startswith(text)
  values = wait_for_idle(served.url)
  assert values["jaxserve_num_requests_running"] == 0
  assert values["jaxserve_num_requests_waiting"] == 0
  assert values["jaxserve_kv_pages_used"] == 0
  assert values.get("jaxserve_requests_finished_total{finish_reason=length}", 0) >= 32


def test_async_openai_client_streams_concurrently(served):
  async def run() -> list[str]:
    async with openai.AsyncOpenAI(
      base_url=f"{served.url}/v1", api_key="unused", max_retries=0
    ) as client:

      async def one(prompt: str) -> str:
        stream = await client.chat.completions.create(
          model=MODEL,
          messages=[{"role": "user", "content": prompt}],
          max_tokens=8,
          temperature=0,
          stream=True,
          extra_body={"ignore_eos": True},
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

      return await asyncio.gather(*(one(p) for p in PROMPTS[:4] * 4))

  texts = asyncio.run(run())
  assert texts[:4] == texts[4:8] == texts[8:12] == texts[12:]


@pytest.mark.parametrize("stream", [False, True])
def test_client_that_leaves_a_long_request_frees_its_pages(served, stream):
  body = _body("a long one", stream, max_tokens=200)

  async def leave_early() -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
      if stream:  # leave as soon as the status line arrives
        async with client.stream("POST", "/v1/completions", json=body) as response:
          assert response.status_code == 200
        return
      with pytest.raises(httpx.ReadTimeout):
        await client.post("/v1/completions", json=body, timeout=0.5)

  aborted_before = scrape_metrics(served.url)["jaxserve_requests_aborted_total"]
  asyncio.run(leave_early())
  values = wait_for_idle(served.url, timeout=5)
  assert values["jaxserve_requests_aborted_total"] == aborted_before + 1
  assert values["jaxserve_kv_pages_used"] == 0
  assert values["jaxserve_num_requests_running"] == 0
