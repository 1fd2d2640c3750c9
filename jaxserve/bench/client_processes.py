"""`jaxserve bench serve`'s load spread over several client processes, so the client keeps up.

One Python process parses SSE chunks at a bounded rate (near 10k chunks/s on a fast host core);
past that the client, not the server, sets the numbers. plan_clients() picks the number of
processes: `--client-processes N` when given, else one per STREAMS_PER_PROCESS streams that can
be open at once (every request at rate inf, --max-concurrency when set) and, at a finite rate,
no more than the expected chunk rate (rate x mean output tokens) over CHUNKS_PER_PROCESS; at most
half of this machine's cores (the server may share them) and never more than the streams.

run_clients() keeps vLLM's workload: the parent draws the one arrival schedule (arrivals.py) and
deals the requests round robin, request i to process i mod N, each at its own send time from one
shared start (time.monotonic(), the same clock in every process). At rate inf the N processes
send in request order, request i at i x INTERLEAVE_S, as one client process's own pace would:
were they all to send at once, the first process to reach the server would fill the server's
first batch with its own streams, whose chunks would then come faster than it parses (ITL pairs
at the client, not the server). --max-concurrency is split
among the processes (the first ones take the remainder). One process runs in this process; more
are spawned (spawned_clients.py): each imports, says it is ready, gets the start time, runs its
share (serve_client.py) and sends back its records and its usage (client_usage.py). Records come
back in request order; the run's duration is from the start to the last process's end, as
vLLM's benchmark duration.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from jaxserve.bench.arrivals import arrival_gaps, send_offsets
from jaxserve.bench.client_usage import ClientUsage, UsageMeter
from jaxserve.bench.datasets import SampleRequest
from jaxserve.bench.gc_pause import settle_heap
from jaxserve.bench.latency_stats import RequestRecord
from jaxserve.bench.serve_client import ServeBenchConfig, run_schedule
from jaxserve.bench.spawned_clients import SpawnedClients

STREAMS_PER_PROCESS = 128  # a process may hold them all streaming at once (a GPU's full batch)
CHUNKS_PER_PROCESS = 4000  # chunks/s: well under what one process can parse
INTERLEAVE_S = 1e-4  # rate inf, several processes: request i is sent at i x this


@dataclass(frozen=True)
class ClientPlan:
  processes: int
  reason: str


@dataclass(frozen=True)
class ClientsResult:
  records: list[RequestRecord]  # in request order
  duration_s: float
  usages: tuple[ClientUsage, ...]


@dataclass(frozen=True)
class _Shard:
  """One process's share: request indices, the requests, their send offsets, its cap."""

  process: int
  indices: tuple[int, ...]
  requests: tuple[SampleRequest, ...]
  offsets: tuple[float, ...]
  concurrency: int | None


def machine_cores() -> int:
  """The cores this process may run on."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def plan_clients(
  requested: int | None,
  requests: Sequence[SampleRequest],
  request_rate: float,
  max_concurrency: int | None,
  cores: int,
) -> ClientPlan:
  """How many client processes (see the module docstring)."""
  streams = max(1, min(len(requests), max_concurrency or len(requests)))
  if requested is not None:
    if requested < 1:
      raise ValueError(f"client_processes: must be >= 1, got {requested}")
    processes = min(requested, streams)
    reason = f"--client-processes {requested}"
    if processes < requested:
      reason += f", one per stream at most ({streams})"
    return ClientPlan(processes, reason)
  need = math.ceil(streams / STREAMS_PER_PROCESS)
  reason = f"auto: one per {STREAMS_PER_PROCESS} streams open at once ({streams})"
  if math.isfinite(request_rate):
    mean_output = sum(r.expected_output_len for r in requests) / max(1, len(requests))
    chunks = request_rate * mean_output
    need = min(need, math.ceil(chunks / CHUNKS_PER_PROCESS))
    reason += f", one per {CHUNKS_PER_PROCESS} chunks/s (about {chunks:.0f})"
  budget = max(1, cores // 2)
  processes = max(1, min(need, budget))
  return ClientPlan(processes, reason + f", at most half of {cores} cores")


def send_schedule(config: ServeBenchConfig, num_requests: int, processes: int) -> list[float]:
  """When each request is sent, in seconds from the start: the arrival schedule, interleaved in
  request order at rate inf from several processes (see the module docstring)."""
  if math.isinf(config.request_rate) and processes > 1:
    return [i * INTERLEAVE_S for i in range(num_requests)]
  gaps = arrival_gaps(num_requests, config.request_rate, config.burstiness, config.seed)
  return send_offsets(gaps).tolist()


def _shards(
  config: ServeBenchConfig, requests: Sequence[SampleRequest], processes: int
) -> list[_Shard]:
  offsets = send_schedule(config, len(requests), processes)
  cap = config.max_concurrency
  shards = []
  for k in range(processes):
    indices = tuple(range(k, len(requests), processes))
    concurrency = None if cap is None else cap // processes + (k < cap % processes)
    shards.append(
      _Shard(
        k,
        indices,
        tuple(requests[i] for i in indices),
        tuple(offsets[i] for i in indices),
        concurrency,
      )
    )
  return shards


@dataclass(frozen=True)
class _ShardResult:
  """A client process's answer: its records (in its shard's order), its end and its usage."""

  process: int
  records: list[RequestRecord]
  end: float
  usage: ClientUsage


def run_clients(
  config: ServeBenchConfig, requests: Sequence[SampleRequest], plan: ClientPlan
) -> ClientsResult:
  """Runs the workload from plan.processes client processes (see the module docstring)."""
  shards = _shards(config, requests, plan.processes)
  bar = tqdm(total=len(requests), desc="requests", unit="req", disable=not config.show_progress)
  try:
    if plan.processes == 1:
      settle_heap()
      start = time.monotonic()
      results = [_run_shard(config, shards[0], start, lambda: bar.update(1))]
    else:
      clients = SpawnedClients(_spawned_shard, [(config, s) for s in shards], "bench client")
      start = clients.begin()
      results = clients.results(lambda: bar.update(1))
  finally:
    bar.close()
  ordered: list[RequestRecord | None] = [None] * len(requests)
  for result in results:
    for index, record in zip(shards[result.process].indices, result.records, strict=True):
      ordered[index] = record
  return ClientsResult(
    [r for r in ordered if r is not None],
    max(result.end for result in results) - start,
    tuple(result.usage for result in results),
  )


def _run_shard(
  config: ServeBenchConfig, shard: _Shard, start: float, on_done: Callable[[], None] | None
) -> _ShardResult:
  async def measured() -> _ShardResult:
    meter = UsageMeter()
    run = await run_schedule(
      config, shard.requests, shard.offsets, start, shard.concurrency, on_done
    )
    usage = meter.usage(shard.process, run.records, shard.offsets)  # while the threads live
    return _ShardResult(shard.process, run.records, run.end, usage)

  return asyncio.run(measured())


def _spawned_shard(
  start: float, progress: Callable[[], None], config: ServeBenchConfig, shard: _Shard
) -> _ShardResult:
  """A spawned client process's share (spawned_clients.py runs it)."""
  return _run_shard(config, shard, start, progress if config.show_progress else None)
