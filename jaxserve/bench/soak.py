"""`jaxserve bench soak` (or `python -m jaxserve.bench.soak`): hold a running server at more load
than it can serve for minutes, with clients that cancel, bad inputs, canaries and killed API
server processes, and report per window what it did and at the end which promises it broke.

1. The served model (/v1/models: name, max_model_len; /tokenize: token ids for long prompts),
   and, on a jaxserve server, its warm-up: the soak starts once every step program is compiled.
2. The capacity, unless --request-rate is given: `--capacity-concurrency` closed-loop clients
   send the good mix for `--capacity-seconds`; the rate is `--load` times the calls completed
   per second in the phase's last 80% (soak_workers.py: calls running at its end not counted).
   Give it more clients than the server batches sequences, or it measures them.
3. The soak: Poisson arrivals at that rate for `--duration` seconds (soak_schedule.py),
   sent from `--client-processes` processes (soak_workers.py), each a canary (every
   `--canary-every` s), a bad input (`--bad-share`), or a good call from the mix (a streamed one
   leaving after 1 to 4 chunks for `--cancel-share`); every `--kill-api-every` s an API server
   process is killed (the server must run on this machine); every `--stall-every` s a client
   sends a long stream and reads nothing of it for `--stall-hold` s; /metrics and the
   processes' RSS are sampled every SAMPLE_EVERY_S.
4. The end: the calls in flight finish, then the server must come back to 0 KV pages in use
   (within IDLE_TIMEOUT_S). The report (soak_report.py): a row per `--window` seconds, a summary
   of what was lost, and the problems; exit status 1 if there is any.

The catalogue of calls is soak_catalogue.py, one call's client soak_client.py, the client
processes soak_workers.py, what is watched soak_monitor.py. `--plot FILE` draws the rows
(jaxserve/tools/plots.py's soak_timeline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass

import httpx

from jaxserve.bench import soak_monitor, soak_workers
from jaxserve.bench.flags import standalone_parser
from jaxserve.bench.soak_catalogue import (
  ServedModel,
  long_stream,
)
from jaxserve.bench.soak_client import stalled_reader
from jaxserve.bench.soak_flags import add_soak_flags
from jaxserve.bench.soak_report import (
  Sample,
  SoakRun,
  format_rows,
  problems,
  summary,
  window_rows,
)
from jaxserve.bench.soak_schedule import ScheduleSpec
from jaxserve.bench.soak_workers import ClientSpec, PhaseResult, ScheduledPhase, http_client

logger = logging.getLogger(__name__)
SAMPLE_EVERY_S = 2.0
IDLE_TIMEOUT_S = 60.0
WARM_TIMEOUT_S = 600.0
FILLER_TEXT = "The quick brown fox jumps over the lazy dog. "


@dataclass(frozen=True)
class SoakPlan:
  """The run's settings (see the flags, soak_flags.py)."""

  duration_s: float
  request_rate: float | None
  load: float
  capacity_s: float
  capacity_concurrency: int
  max_tokens: int
  cancel_share: float
  bad_share: float
  canary_every_s: float
  kill_api_every_s: float | None
  window_s: float
  seed: int
  stall_every_s: float | None = None
  stall_hold_s: float = 60.0
  client_processes: int = 1

  def __post_init__(self) -> None:
    for name in ("cancel_share", "bad_share"):
      if not 0 <= getattr(self, name) <= 1:
        raise ValueError(f"--{name.replace('_', '-')}: must be in [0, 1]")
    if self.duration_s <= 0 or self.window_s <= 0 or self.max_tokens < 1:
      raise ValueError("--duration, --window: must be > 0; --max-tokens: >= 1")
    if self.client_processes < 1:
      raise ValueError(f"--client-processes: must be >= 1, got {self.client_processes}")


async def served_model(client: httpx.AsyncClient) -> ServedModel:
  card = (await client.get("/v1/models")).raise_for_status().json()["data"][0]
  tokens = await client.post("/tokenize", json={"model": card["id"], "prompt": FILLER_TEXT * 4})
  ids = tuple(tokens.raise_for_status().json()["tokens"][1:]) or (1,)
  return ServedModel(card["id"], int(card["max_model_len"]), ids)


async def wait_until_warm(client: httpx.AsyncClient) -> None:
  """Until a jaxserve server has compiled every step program (at once for other servers)."""
  deadline = time.monotonic() + WARM_TIMEOUT_S
  while time.monotonic() < deadline:
    values = await soak_monitor.scrape(client)
    total = values.get("jaxserve_step_programs_total")
    if total is None or values.get("jaxserve_step_programs_compiled", 0) >= total:
      return
    await asyncio.sleep(1)
  raise RuntimeError("the server did not finish compiling its step programs")


async def _stalls(base_url: str, model: ServedModel, plan: SoakPlan, run: SoakRun) -> None:
  """A stalled reader every stall_every_s seconds of the soak."""
  url, readers = httpx.URL(base_url), []
  at = run.start + plan.stall_every_s
  while at < run.start + plan.duration_s:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    reader = stalled_reader(url.host, url.port, long_stream(model), plan.stall_hold_s)
    readers.append(asyncio.ensure_future(reader))
    at += plan.stall_every_s
  run.records.extend(await asyncio.gather(*readers))


async def _watch(client, port: int | None, plan: SoakPlan, run: SoakRun, stop: asyncio.Event):
  next_kill = run.start + (plan.kill_api_every_s or float("inf"))
  while not stop.is_set():
    pids = soak_monitor.server_pids(port) if port else []
    metrics = await soak_monitor.scrape(client)
    run.samples.append(Sample(time.monotonic(), metrics, soak_monitor.rss_bytes(pids)))
    if next_kill <= time.monotonic() < run.start + plan.duration_s and port:
      signalled_at = time.monotonic()  # before the signal: its streams may end before it returns
      victim = soak_monitor.kill_api_server(port)
      if victim is not None:
        run.kills.append((signalled_at, victim))
        logger.info("killed API server process %d (SIGKILL)", victim)
      next_kill += plan.kill_api_every_s
    try:
      await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)
    except asyncio.TimeoutError:
      pass


async def _final_metrics(client: httpx.AsyncClient) -> dict[str, float]:
  """/metrics once nothing runs (KV pages back to 0), or after IDLE_TIMEOUT_S."""
  deadline = time.monotonic() + IDLE_TIMEOUT_S
  while True:
    values = await soak_monitor.scrape(client)
    idle = values.get("jaxserve_kv_pages_used", 0) == 0 and not values.get(
      "jaxserve_num_requests_running"
    )
    if idle or time.monotonic() > deadline:
      return values
    await asyncio.sleep(0.5)


async def run_soak(base_url: str, plan: SoakPlan, api_key: str | None = None) -> SoakRun:
  spec = ClientSpec(base_url, api_key)
  async with http_client(spec) as client:
    model = await served_model(client)
    await wait_until_warm(client)
    rate = plan.request_rate
    if rate is None:
      capacity, measured = await soak_workers.capacity(
        spec,
        model,
        max_tokens=plan.max_tokens,
        concurrency=plan.capacity_concurrency,
        seconds=plan.capacity_s,
        seed=plan.seed,
        processes=plan.client_processes,
      )
      rate = plan.load * capacity
      logger.info("capacity %.2f calls/s: the soak sends %.2f calls/s", capacity, rate)
      _warn_if_client_bound("capacity", measured)
    calls = ScheduleSpec(
      model,
      rate,
      plan.duration_s,
      plan.seed,
      plan.max_tokens,
      plan.cancel_share,
      plan.bad_share,
      plan.canary_every_s,
    )
    phase = ScheduledPhase(spec, calls, plan.client_processes)
    await phase.prepare()
    compilations = (await soak_monitor.scrape(client)).get("jaxserve_xla_compilations_total")
    start = phase.begin()
    run = SoakRun(start=start, window_s=plan.window_s, load_end=start + plan.duration_s)
    run.compilations_at_start, run.request_rate = compilations, rate
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(_watch(client, httpx.URL(base_url).port, plan, run, stop))
    stalls = _stalls(base_url, model, plan, run) if plan.stall_every_s else asyncio.sleep(0)
    sent, _ = await asyncio.gather(phase.finish(), stalls)
    run.records.extend(sent.records)
    run.client_cpu_shares = sent.cpu_shares
    _warn_if_client_bound("soak", sent)
    stop.set()
    await watcher
    run.final_metrics = await _final_metrics(client)
  return run


def _warn_if_client_bound(phase: str, result: PhaseResult) -> None:
  if result.client_bound:
    logger.warning(
      "the soak's client processes were busy %s of a core in the %s phase: the client, not the "
      "server, may have set the pace (raise --client-processes)",
      "/".join(f"{share:.2f}" for share in result.cpu_shares),
      phase,
    )


def main(args: argparse.Namespace) -> int:
  plan = SoakPlan(
    args.duration,
    args.request_rate,
    args.load,
    args.capacity_seconds,
    args.capacity_concurrency,
    args.max_tokens,
    args.cancel_share,
    args.bad_share,
    args.canary_every,
    args.kill_api_every,
    args.window,
    args.seed,
    args.stall_every,
    args.stall_hold,
    args.client_processes,
  )
  run = asyncio.run(run_soak(args.base_url, plan, args.api_key))
  rows, totals = window_rows(run), summary(run)
  found = problems(
    run,
    canaries_must_match=args.canaries_must_match,
    rss_growth=args.rss_growth,
    latency_drift=args.latency_drift,
    device_memory_growth=args.device_memory_growth,
    overloaded=plan.request_rate is None and plan.load > 1,
  )
  print(format_rows(rows))
  print(json.dumps(totals))
  print("\n".join(f"PROBLEM: {p}" for p in found) or "no problems")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"rows": rows, "summary": totals, "problems": found}, f, indent=1)
  if args.plot:
    from jaxserve.tools.plots import soak_timeline

    print(f"plot: {soak_timeline({args.base_url: rows}, args.plot, 'bench soak')}")
  return 1 if found else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = standalone_parser("soak", __doc__)
  add_soak_flags(parser)
  return parser.parse_args(argv)


if __name__ == "__main__":
  from jaxserve.runtime.log_setup import configure_logging

  configure_logging("INFO")
  logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per call otherwise
  sys.exit(main(parse_args()))
