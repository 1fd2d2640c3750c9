"""A plain load client, independent of `jaxserve bench serve`: the check that the benchmark drives a
server as hard as another client does (issue 29). It shares no code with jaxserve: N processes
(multiprocessing), each an asyncio loop with one httpx.AsyncClient, send their share of
`--num-prompts` streamed completions of random token ids (`--input-len` in, `--output-len` out,
ignore_eos, usage in the last chunk) all at once from one start time, read every chunk, and
report the output tokens the server's usage counted and when their last stream ended. Output
tokens per second = all tokens / (last end - start).

    python scripts/plain_client.py --url http://127.0.0.1:8000 --model NAME --processes 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import resource
import sys
import time

import httpx


def parse_args(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--url", required=True)
  parser.add_argument("--model", required=True)
  parser.add_argument("--num-prompts", type=int, default=1000)
  parser.add_argument("--input-len", type=int, default=256)
  parser.add_argument("--output-len", type=int, default=256)
  parser.add_argument("--processes", type=int, default=4)
  parser.add_argument("--token-range", default="1000,30000", help="prompt token ids: low,high")
  parser.add_argument("--seed", type=int, default=11)
  parser.add_argument("--out", help="JSON result")
  return parser.parse_args(argv)


async def _stream(client: httpx.AsyncClient, body: dict) -> tuple[int, bool]:
  tokens, ok = 0, False
  async with client.stream("POST", "/v1/completions", json=body) as response:
    if response.status_code != 200:
      return 0, False
    async for line in response.aiter_lines():
      if not line.startswith("data: ") or line == "data: [DONE]":
        continue
      chunk = json.loads(line[6:])
      if chunk.get("usage"):
        tokens, ok = chunk["usage"]["completion_tokens"], True
  return tokens, ok


async def _share(args: argparse.Namespace, prompts: list[list[int]], start: float) -> dict:
  await asyncio.sleep(max(0.0, start - time.monotonic()))
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
  async with httpx.AsyncClient(base_url=args.url, timeout=3600, limits=limits) as client:
    body = {"model": args.model, "max_tokens": args.output_len, "ignore_eos": True}
    body.update(temperature=0, stream=True, stream_options={"include_usage": True})
    results = await asyncio.gather(*(_stream(client, {**body, "prompt": p}) for p in prompts))
  return {"tokens": sum(t for t, _ in results), "failed": sum(not ok for _, ok in results)}


def _worker(args, prompts, start, queue) -> None:
  cpu = resource.getrusage(resource.RUSAGE_SELF)
  result = asyncio.run(_share(args, prompts, start))
  now = resource.getrusage(resource.RUSAGE_SELF)
  result["end"] = time.monotonic()
  result["cpu_s"] = now.ru_utime + now.ru_stime - cpu.ru_utime - cpu.ru_stime
  queue.put(result)


def main(argv: list[str]) -> int:
  args = parse_args(argv)
  low, high = (int(x) for x in args.token_range.split(","))
  rng = random.Random(args.seed)
  prompts = [
    [rng.randrange(low, high) for _ in range(args.input_len)] for _ in range(args.num_prompts)
  ]
  context = multiprocessing.get_context("spawn")
  queue = context.Queue()
  start = time.monotonic() + 3.0  # every process imported and waiting
  shares = [prompts[k :: args.processes] for k in range(args.processes)]
  workers = [context.Process(target=_worker, args=(args, s, start, queue)) for s in shares]
  for w in workers:
    w.start()
  parts = [queue.get() for _ in workers]
  for w in workers:
    w.join()
  duration = max(p["end"] for p in parts) - start
  tokens = sum(p["tokens"] for p in parts)
  result = {
    "output_tokens": tokens,
    "failed": sum(p["failed"] for p in parts),
    "duration_s": duration,
    "output_tokens_per_s": tokens / duration,
    "cpu_share_per_process": [p["cpu_s"] / duration for p in parts],
  }
  print(json.dumps(result))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
