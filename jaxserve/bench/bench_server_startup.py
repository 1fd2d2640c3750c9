"""`jaxserve serve` start-up end to end: a fresh start with an empty compilation cache, a mixed
workload once the background compilation is done, and a warm restart.

    jaxserve bench server-startup --model /tmp/llama8b --config configs/h100.yaml \
        --max-model-len 2048 --workload-s 150 --out out/server_startup.json
    python -m jaxserve.bench.bench_server_startup ...  # the same flags

Each phase starts the server in a subprocess (`python -m jaxserve.cli serve ... --set
compilation_cache_dir=DIR`, DIR empty for the fresh start, the same DIR for the restart) and
times, from the process start: /health answering 200, a greedy completion (its text compared
between the phases: the fresh server answers it padded to the largest bucket, the restart maybe
in its own), and /metrics reporting every step program compiled. After that, a mixed workload
(random token prompts of 1 to --max-prompt tokens, 1 to --max-output tokens, greedy / random /
penalties / top logprobs / prompt logprobs / n=2, --concurrency at a time) runs for --workload-s
seconds; the XLA compilations it caused (jaxserve_xla_compilations before and after) must be 0.
Then it waits (STORE_WAIT_S at most) for the server, idle, to write its compiled programs to the
program store, which the restart reads. From the server's log: the weights' GB and GB/s, the
KV pool, the warmup lines. The restart phase waits for its compile thread only with
--restart-wait. With --tpot-probes (default: one stream and four concurrent ones;
bench/tpot_probe.py) streams are timed right after the fresh /health and again once every
program is compiled. Prints a table and one JSON object (also
written to --out). Needs httpx; the server needs starlette and uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx

from jaxserve.bench.flags import add_server_startup_flags, standalone_parser
from jaxserve.bench.server_process import ServerProcess
from jaxserve.bench.tpot_probe import tpot_probes
from jaxserve.tools.json_file import write_json
from jaxserve.tools.key_value_table import key_value_table

PROBE = {
  "prompt": "The quick brown fox jumps over the lazy dog. " * 4,
  "max_tokens": 24,
  "temperature": 0.0,
  "ignore_eos": True,
}
LOG_FACTS = {
  "weights": r"(\d+\.\d+ GB in \d+\.\d+ s \(\d+\.\d+ GB/s[^)]*\))",
  "after_weights": r"device memory: (largest free block .*)",
  "kv_budget": r"device memory: (.* loader slack, .*)",
  "kv_cache": r"KV cache: (\d+ pages of \d+ tokens \([^)]*\))",
  "buckets": r"buckets: (.*)",
  "warmup_first": r"warmup: (\d+ of \d+ programs compiled in [\d.]+ s)",
  "cache_use": r"warmup: (\d+ programs read from the program store, \d+ loaded from the "
  r"compilation cache, \d+ compiled)",
  "background": r"background compilation: (.*)",
  "store": r"program store: (\d+ programs written .*)",
  "ready": r"ready in ([\d.]+)s",
}


def parse_args(argv=None) -> argparse.Namespace:
  parser = standalone_parser("bench_server_startup", __doc__)
  add_server_startup_flags(parser)
  return parser.parse_args(argv)


def start_server(args: argparse.Namespace, cache_dir: str, log_path: Path) -> ServerProcess:
  """`jaxserve serve` with the benchmark's engine flags and compilation cache."""
  flags = [
    "--max-model-len",
    str(args.max_model_len),
    "--set",
    f"compilation_cache_dir={cache_dir}",
  ]
  flags += ["--config", args.config] if args.config else []
  for override in args.set:
    flags += ["--set", override]
  return ServerProcess(args.model, flags, log_path)


STORE_WRITTEN = r"program store: \d+ programs written"
STORE_WAIT_S = 180.0


def wait_for_log(path: Path, pattern: str, timeout_s: float) -> float | None:
  """Seconds until `pattern` appears in the log at `path` (the server writes its compiled programs
  to the store once idle, before the restart reads them), None after `timeout_s`."""
  start = time.monotonic()
  while time.monotonic() - start < timeout_s:
    if re.search(pattern, path.read_text(errors="replace")):
      return time.monotonic() - start
    time.sleep(0.5)
  return None


def log_facts(log_path: Path) -> dict[str, str]:
  """What the server's log says of weights, KV pool, buckets and compilation (LOG_FACTS)."""
  text = log_path.read_text()
  facts = {}
  for name, pattern in LOG_FACTS.items():
    found = re.findall(pattern, text)
    if found:
      facts[name] = found[-1] if name != "weights" else found[0]
  return facts


def random_request(rng: random.Random, vocab: int, max_prompt: int, max_output: int) -> dict:
  prompt = [rng.randrange(min(100, vocab - 1), vocab) for _ in range(rng.randint(1, max_prompt))]
  body = {"prompt": prompt, "max_tokens": rng.randint(1, max_output), "ignore_eos": True}
  kind = rng.randrange(6)
  if kind == 1:
    body.update(temperature=0.8, top_p=0.9, top_k=50, seed=rng.randrange(1 << 30))
  elif kind == 2:
    body.update(
      temperature=0.7, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1
    )
  elif kind == 3:
    body.update(temperature=0.0, logprobs=5)
  elif kind == 4:
    body.update(temperature=0.0, echo=True, logprobs=1, max_tokens=rng.randint(1, 4))
  elif kind == 5:
    body.update(temperature=0.9, n=2, seed=rng.randrange(1 << 30))
  else:
    body.update(temperature=0.0)
  return body


async def mixed_workload(
  url: str,
  model: str,
  seconds: float,
  concurrency: int,
  vocab: int,
  max_prompt: int,
  max_output: int,
  seed: int = 0,
) -> dict:
  rng, deadline = random.Random(seed), time.monotonic() + seconds
  counts = {"ok": 0, "failed": 0, "output_tokens": 0}
  async with httpx.AsyncClient(base_url=url, timeout=600.0) as client:

    async def worker() -> None:
      while time.monotonic() < deadline:
        body = random_request(rng, vocab, max_prompt, max_output)
        response = await client.post("/v1/completions", json={"model": model, **body})
        if response.status_code == 200:
          counts["ok"] += 1
          counts["output_tokens"] += response.json()["usage"]["completion_tokens"]
        else:
          counts["failed"] += 1
          key = f"status_{response.status_code}"
          counts[key] = counts.get(key, 0) + 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
  return counts


def start_phase(
  args: argparse.Namespace, cache_dir: str, log_path: Path
) -> tuple[ServerProcess, dict]:
  server = start_server(args, cache_dir, log_path)
  result = {"health_200_s": server.wait_healthy(args.compile_timeout_s)}
  result["probe_text"], seconds = server.complete(PROBE)
  result["first_request_done_s"], result["first_request_s"] = server.since_start(), seconds
  values = server.metrics()
  result["programs_at_ready"] = (
    f"{values.get('jaxserve_step_programs_compiled', 0):.0f} / "
    f"{values.get('jaxserve_step_programs_total', 0):.0f}"
  )
  return server, result


def main(argv=None) -> int:
  return command(parse_args(argv))


def command(args: argparse.Namespace) -> int:
  """The benchmark on parsed flags (`jaxserve bench server-startup` calls it). The servers'
  logs go beside --out, or without it into a temporary directory."""
  out_dir = Path(args.out).parent if args.out else Path(tempfile.mkdtemp(prefix="jaxserve-logs-"))
  out_dir.mkdir(parents=True, exist_ok=True)
  cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="jaxserve-xla-")
  config_file = Path(args.model) / "config.json"  # tiny-random (tests) has none
  vocab = json.loads(config_file.read_text())["vocab_size"] if config_file.is_file() else 256
  report: dict = {"model": args.model, "config": args.config, "cache_dir": cache_dir}

  server, fresh = start_phase(args, cache_dir, out_dir / "server_fresh.log")
  try:
    if args.tpot_probes:
      fresh["tpot_at_ready_ms"] = tpot_probes(server.url, server.model, vocab, args.tpot_probes)
    fresh["all_compiled_s"] = server.wait_compiled(args.compile_timeout_s)
    if args.tpot_probes:
      fresh["tpot_all_compiled_ms"] = tpot_probes(
        server.url, server.model, vocab, args.tpot_probes, seed=1
      )
    fresh["probe_text_all_compiled"] = server.complete(PROBE)[0]
    before = server.metrics()["jaxserve_xla_compilations_total"]
    fresh["workload"] = asyncio.run(
      mixed_workload(
        server.url,
        server.model,
        args.workload_s,
        args.concurrency,
        vocab,
        args.max_prompt,
        args.max_output,
      )
    )
    fresh["workload"]["seconds"] = args.workload_s
    fresh["workload"]["compilations"] = server.metrics()["jaxserve_xla_compilations_total"] - before
    fresh["store_written_s"] = wait_for_log(server.log_path, STORE_WRITTEN, STORE_WAIT_S)
  finally:
    server.stop()
  fresh["log"] = log_facts(server.log_path)
  report["fresh"] = fresh

  server, warm = start_phase(args, cache_dir, out_dir / "server_restart.log")
  try:
    if args.restart_wait:
      warm["all_compiled_s"] = server.wait_compiled(args.compile_timeout_s)
  finally:
    server.stop()
  warm["log"] = log_facts(server.log_path)
  warm["same_probe_text"] = warm["probe_text"] == fresh["probe_text"]
  report["restart"] = warm
  print(format_table(report))
  if args.out:
    write_json(args.out, report)
  else:
    print(f"server logs in {out_dir}")
  print(json.dumps(report))
  return 0


def format_table(report: dict) -> str:
  fresh, warm = report["fresh"], report["restart"]
  load = fresh["log"]
  rows = [
    (
      "fresh: /health 200",
      f"{fresh['health_200_s']:.1f} s (programs {fresh['programs_at_ready']})",
    ),
    (
      "fresh: first completion done",
      f"{fresh['first_request_done_s']:.1f} s ({fresh['first_request_s']:.2f} s)",
    ),
    ("fresh: every program compiled", f"{fresh['all_compiled_s']:.1f} s"),
    *tpot_rows(fresh),
    (
      "fresh: probe text unchanged once all compiled",
      str(fresh["probe_text"] == fresh["probe_text_all_compiled"]),
    ),
    ("weights", load.get("weights", "?")),
    ("device memory after loading", load.get("after_weights", "?")),
    ("KV cache", load.get("kv_cache", "?")),
    ("warmup (first bucket)", load.get("warmup_first", "?")),
    ("background", load.get("background", "?")),
    (
      "workload",
      f"{fresh['workload']['seconds']:.0f} s, {fresh['workload']['ok']} ok, "
      f"{fresh['workload']['failed']} failed, {fresh['workload']['output_tokens']} tokens",
    ),
    ("workload compilations (must be 0)", str(fresh["workload"]["compilations"])),
    (
      "restart: /health 200",
      f"{warm['health_200_s']:.1f} s (programs {warm['programs_at_ready']})",
    ),
    (
      "restart: first completion done",
      f"{warm['first_request_done_s']:.1f} s, same text: {warm['same_probe_text']}",
    ),
    ("restart: cache", warm["log"].get("cache_use", "?")),
  ]
  if "all_compiled_s" in warm:
    rows.append(("restart: every program compiled", f"{warm['all_compiled_s']:.1f} s"))
  return key_value_table(rows)


def tpot_rows(fresh: dict) -> list[tuple[str, str]]:
  """A row per TPOT probe (--tpot-probes): at /health and once all programs are compiled."""
  at_ready, compiled = fresh.get("tpot_at_ready_ms", {}), fresh.get("tpot_all_compiled_ms", {})
  rows = []
  for name, early in at_ready.items():
    late = compiled[name]
    rows.append(
      (
        f"fresh: TPOT {name}, at /health vs all compiled",
        f"{early:.2f} vs {late:.2f} ms ({early / late:.2f}x)",
      )
    )
  return rows


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  sys.exit(main())
