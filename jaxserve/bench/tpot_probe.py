"""Decode-speed probes of a running server (`jaxserve bench server-startup --tpot-probes`).

Each probe streams greedy completions of random token-id prompts (ignore_eos, so every request
decodes its full length) through serve_client.run_schedule, all sent at once, and reports the
median of the requests' TPOT (time per output token after the first) in milliseconds. The
default probes are a single stream and four concurrent 512-in / 64-out streams: the requests a
user sends right after /health, timed then and again once every step program is compiled, so
their ratio says how much slower the server runs while it compiles. Prompts are random, so no
prefix cache hit shortens a probe.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time

from jaxserve.bench.datasets import SampleRequest
from jaxserve.bench.flags import DEFAULT_TPOT_PROBES
from jaxserve.bench.serve_client import ServeBenchConfig, run_schedule


def parse_probes(text: str) -> list[tuple[int, int, int]]:
  """ "1x128/128,4x512/64" -> [(1, 128, 128), (4, 512, 64)]: (requests, prompt, output tokens)."""
  probes = []
  for item in text.split(","):
    try:
      count, lengths = item.strip().split("x")
      prompt, output = lengths.split("/")
      probe = (int(count), int(prompt), int(output))
    except ValueError as err:
      raise ValueError(
        f"--tpot-probes: {item!r} is not COUNTxPROMPT/OUTPUT (e.g. 4x512/64)"
      ) from err
    if min(probe) < 1 or probe[2] < 2:
      raise ValueError(f"--tpot-probes: {item!r} needs counts >= 1 and an output of >= 2 tokens")
    probes.append(probe)
  return probes


def probe_requests(
  count: int, prompt_len: int, output_len: int, vocab: int, rng: random.Random
) -> list[SampleRequest]:
  low = min(100, vocab - 1)
  return [
    SampleRequest(
      tuple(rng.randrange(low, vocab) for _ in range(prompt_len)), prompt_len, output_len
    )
    for _ in range(count)
  ]


def tpot_probes(
  url: str, model: str, vocab: int, probes: str = DEFAULT_TPOT_PROBES, seed: int = 0
) -> dict[str, float]:
  """Each probe's median TPOT in ms, by its COUNTxPROMPT/OUTPUT; raises if a request failed."""
  rng, config = random.Random(seed), ServeBenchConfig(url, model, ignore_eos=True)
  result = {}
  for count, prompt_len, output_len in parse_probes(probes):
    name = f"{count}x{prompt_len}/{output_len}"
    requests = probe_requests(count, prompt_len, output_len, vocab, rng)
    run = asyncio.run(run_schedule(config, requests, [0.0] * count, time.monotonic(), None))
    failed = [r.error for r in run.records if not r.success]
    if failed:
      raise RuntimeError(f"TPOT probe {name}: {failed[0]}")
    result[name] = 1000 * statistics.median(r.tpot for r in run.records if r.tpot is not None)
  return result
