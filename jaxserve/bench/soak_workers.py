"""The soak's calls from one or several client processes, so the client keeps up with the server.

One Python process parses near 10k SSE chunks/s; a large server driven past its capacity streams
more than that, and then the client, not the server, sets what the soak sees. With `processes`
> 1 both phases of the soak run in that many spawned processes:

- `capacity`: `concurrency` closed-loop clients split among the processes, each counting the
  good calls it completed inside the measured window: the phase's last WINDOW_SHARE of its
  seconds (the first part lets the connections open and the first calls' one-time work pass;
  a call still running at the deadline is not counted). The capacity is their sum over the window's
  length.
- `ScheduledPhase`: the soak's calls (soak_schedule.py: each process draws the same sequence
  from its spec and sends every n-th call, the k-th process from the k-th), each at its offset
  from one shared start (time.monotonic(), one clock for every process on the machine). The
  parent keeps its event loop (the watcher and the stalled readers of soak.py run on) while
  the processes send.

The processes are spawned_clients.py's. With `processes` == 1 the same coroutines run in the
caller's event loop. Each phase reports
every process's CPU share (CPU time over wall time); a share near 1 means that process was the
bottleneck (soak.py says so and to raise --client-processes).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from jaxserve.bench.gc_pause import no_cycle_collection, settle_heap
from jaxserve.bench.soak_catalogue import ServedModel, SoakRequest, good_request
from jaxserve.bench.soak_client import SoakRecord, send
from jaxserve.bench.soak_schedule import ScheduleSpec, calls
from jaxserve.bench.spawned_clients import SpawnedClients

BOTTLENECK_SHARE = 0.9
WINDOW_SHARE = 0.8  # of the capacity phase's seconds, the measured part (its end)


@dataclass(frozen=True)
class ClientSpec:
  """How every client process reaches the server."""

  base_url: str
  api_key: str | None = None


@dataclass(frozen=True)
class PhaseResult:
  """What the processes did: the soak's records (empty for the capacity phase), the good calls
  completed (the capacity phase), each process's CPU share."""

  records: list[SoakRecord]
  completed: int
  cpu_shares: tuple[float, ...]

  @property
  def client_bound(self) -> bool:
    return any(share >= BOTTLENECK_SHARE for share in self.cpu_shares)


@dataclass(frozen=True)
class _Capacity:
  model: ServedModel
  max_tokens: int
  workers: int
  seed: str
  seconds: float


@dataclass(frozen=True)
class _Share:
  """Every `of`-th call of the schedule, from the `first`-th."""

  schedule: ScheduleSpec
  first: int
  of: int


def http_client(spec: ClientSpec) -> httpx.AsyncClient:
  headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
  return httpx.AsyncClient(
    base_url=spec.base_url, timeout=httpx.Timeout(300.0), limits=limits, headers=headers
  )


def _window(start: float, seconds: float) -> tuple[float, float]:
  """The capacity phase's measured window (module docstring), in time.monotonic() seconds."""
  return start + (1 - WINDOW_SHARE) * seconds, start + seconds


async def _closed_loop(client: httpx.AsyncClient, job: _Capacity, start: float) -> int:
  """Good calls completed inside the measured window by job.workers closed-loop clients."""
  rng, done = random.Random(job.seed), 0
  opens, deadline = _window(start, job.seconds)

  async def worker() -> None:
    nonlocal done
    while time.monotonic() < deadline:
      record = await send(client, good_request(rng, job.model, job.max_tokens))
      ended = time.monotonic()
      done += record.status == 200 and not record.cut and opens <= ended <= deadline

  await asyncio.gather(*(worker() for _ in range(job.workers)))
  return done


async def _send_at(client: httpx.AsyncClient, share: _Share, start: float) -> list[SoakRecord]:
  records: list[SoakRecord] = []
  pending: set[asyncio.Task] = set()

  async def call(request: SoakRequest) -> None:
    records.append(await send(client, request))

  for offset, request in itertools.islice(calls(share.schedule), share.first, None, share.of):
    await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
    task = asyncio.ensure_future(call(request))
    pending.add(task)
    task.add_done_callback(pending.discard)
  await asyncio.gather(*pending)
  return records


async def _run_job(spec: ClientSpec, job: _Capacity | _Share, start: float) -> PhaseResult:
  wall, cpu = time.monotonic(), time.process_time()
  async with http_client(spec) as client:
    with no_cycle_collection():
      if isinstance(job, _Capacity):
        records, done = [], await _closed_loop(client, job, start)
      else:
        records, done = await _send_at(client, job, start), 0
  share = (time.process_time() - cpu) / max(time.monotonic() - wall, 1e-9)
  return PhaseResult(records, done, (share,))


def _spawned_job(
  start: float, _progress: Callable[[], None], spec: ClientSpec, job: _Capacity | _Share
) -> PhaseResult:
  """A spawned client process's job (spawned_clients.py runs it)."""
  return asyncio.run(_run_job(spec, job, start))


def _merged(parts: list[PhaseResult]) -> PhaseResult:
  return PhaseResult(
    [r for part in parts for r in part.records],
    sum(part.completed for part in parts),
    tuple(share for part in parts for share in part.cpu_shares),
  )


def _spawn(spec: ClientSpec, jobs: list) -> SpawnedClients:
  return SpawnedClients(_spawned_job, [(spec, job) for job in jobs], "soak client")


async def capacity(
  spec: ClientSpec,
  model: ServedModel,
  *,
  max_tokens: int,
  concurrency: int,
  seconds: float,
  seed: int,
  processes: int,
) -> tuple[float, PhaseResult]:
  """Good calls completed per second by `concurrency` closed-loop clients, and the phase."""
  shares = [concurrency // processes + (k < concurrency % processes) for k in range(processes)]
  jobs = [
    _Capacity(model, max_tokens, n, f"capacity {seed} {k}", seconds)
    for k, n in enumerate(shares)
    if n
  ]
  if len(jobs) == 1:
    settle_heap()
    start = time.monotonic()
    result = await _run_job(spec, jobs[0], start)
  else:
    spawned = await asyncio.to_thread(_spawn, spec, jobs)
    start = spawned.begin()
    result = _merged(await asyncio.to_thread(spawned.results))
  return result.completed / (WINDOW_SHARE * seconds), result


class ScheduledPhase:
  """The soak's calls at their times: `prepare` (spawns and readies the processes), `begin`
  (the shared start, time.monotonic()), then `await finish()` for the records."""

  def __init__(self, spec: ClientSpec, schedule: ScheduleSpec, processes: int):
    self._spec, self._processes = spec, processes
    self._shares = [_Share(schedule, k, processes) for k in range(processes)]
    self._spawned: SpawnedClients | None = None
    self._local: asyncio.Future | None = None

  async def prepare(self) -> None:
    if self._processes > 1:
      self._spawned = await asyncio.to_thread(_spawn, self._spec, self._shares)

  def begin(self) -> float:
    if self._spawned is not None:
      return self._spawned.begin()
    settle_heap()
    start = time.monotonic()
    self._local = asyncio.ensure_future(_run_job(self._spec, self._shares[0], start))
    return start

  async def finish(self) -> PhaseResult:
    if self._spawned is not None:
      return _merged(await asyncio.to_thread(self._spawned.results))
    if self._local is None:
      raise RuntimeError("ScheduledPhase.finish before begin")
    return await self._local
