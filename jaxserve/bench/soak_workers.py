"""The soak's calls from one or several client processes, so the client keeps up with the server.

One Python process parses near 10k SSE chunks/s; a large server driven past its capacity streams
more than that, and then the client, not the server, sets what the soak sees. With `processes`
> 1 both phases of the soak run in that many spawned processes:

- `capacity`: `concurrency` closed-loop clients split among the processes, each counting the
  good calls it completed before the shared deadline; the capacity is their sum per second.
- `ScheduledPhase`: the soak's calls (soak_schedule.py: each process draws the same sequence
  from its spec and sends every n-th call, the k-th process from the k-th), each at its offset
  from one shared start (time.monotonic(), one clock for every process on the machine). The
  parent keeps its event loop (the watcher and the stalled readers of soak.py run on) while
  the processes send.

With `processes` == 1 the same coroutines run in the caller's event loop. Each phase reports
every process's CPU share (CPU time over wall time); a share near 1 means that process was the
bottleneck (soak.py says so and to raise --client-processes).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import random
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import httpx

from jaxserve.bench.gc_pause import no_cycle_collection, settle_heap
from jaxserve.bench.soak_catalogue import ServedModel, SoakRequest, good_request
from jaxserve.bench.soak_client import SoakRecord, send
from jaxserve.bench.soak_schedule import ScheduleSpec, calls

START_DELAY_S = 0.05  # from sending the start time to the start, so every process has it
BOTTLENECK_SHARE = 0.9


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


@dataclass(frozen=True)
class _Failed:
  error: str


def http_client(spec: ClientSpec) -> httpx.AsyncClient:
  headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
  return httpx.AsyncClient(
    base_url=spec.base_url, timeout=httpx.Timeout(300.0), limits=limits, headers=headers
  )


async def _closed_loop(client: httpx.AsyncClient, job: _Capacity, deadline: float) -> int:
  rng, done = random.Random(job.seed), 0

  async def worker() -> None:
    nonlocal done
    while time.monotonic() < deadline:
      record = await send(client, good_request(rng, job.model, job.max_tokens))
      done += record.status == 200 and not record.cut

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
        records, done = [], await _closed_loop(client, job, start + job.seconds)
      else:
        records, done = await _send_at(client, job, start), 0
  share = (time.process_time() - cpu) / max(time.monotonic() - wall, 1e-9)
  return PhaseResult(records, done, (share,))


def _worker(conn: Connection, spec: ClientSpec, job: _Capacity | _Share) -> None:
  """A spawned client process: ready, the start time in, its PhaseResult out."""
  try:
    settle_heap()
    conn.send("ready")
    start = conn.recv()
    conn.send(asyncio.run(_run_job(spec, job, start)))
  except BaseException as err:  # the parent reports it
    conn.send(_Failed(f"{type(err).__name__}: {err}"))
  finally:
    conn.close()


def _receive(conn: Connection):
  try:
    message = conn.recv()
  except EOFError:
    raise RuntimeError("a soak client process exited before its result") from None
  if isinstance(message, _Failed):
    raise RuntimeError(f"a soak client process failed: {message.error}")
  return message


class _Spawned:
  """The processes of one phase, spawned and ready; `begin` sends the start, `results` waits."""

  def __init__(self, spec: ClientSpec, jobs: list):
    context = multiprocessing.get_context("spawn")
    self.conns, self.processes = [], []
    for job in jobs:
      parent, child = context.Pipe()
      process = context.Process(target=_worker, args=(child, spec, job), daemon=True)
      process.start()
      child.close()
      self.conns.append(parent)
      self.processes.append(process)
    for conn in self.conns:
      if _receive(conn) != "ready":
        raise RuntimeError("a soak client process did not say it was ready")

  def begin(self) -> float:
    start = time.monotonic() + START_DELAY_S
    for conn in self.conns:
      conn.send(start)
    return start

  def results(self) -> PhaseResult:
    try:
      parts = [_receive(conn) for conn in self.conns]
    finally:
      for process in self.processes:
        process.join(10)
        if process.is_alive():
          process.kill()
    return PhaseResult(
      [r for part in parts for r in part.records],
      sum(part.completed for part in parts),
      tuple(share for part in parts for share in part.cpu_shares),
    )


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
    spawned = await asyncio.to_thread(_Spawned, spec, jobs)
    start = spawned.begin()
    result = await asyncio.to_thread(spawned.results)
  return result.completed / max(time.monotonic() - start, 1e-9), result


class ScheduledPhase:
  """The soak's calls at their times: `prepare` (spawns and readies the processes), `begin`
  (the shared start, time.monotonic()), then `await finish()` for the records."""

  def __init__(self, spec: ClientSpec, schedule: ScheduleSpec, processes: int):
    self._spec, self._processes = spec, processes
    self._shares = [_Share(schedule, k, processes) for k in range(processes)]
    self._spawned: _Spawned | None = None
    self._local: asyncio.Future | None = None

  async def prepare(self) -> None:
    if self._processes > 1:
      self._spawned = await asyncio.to_thread(_Spawned, self._spec, self._shares)

  def begin(self) -> float:
    if self._spawned is not None:
      return self._spawned.begin()
    settle_heap()
    start = time.monotonic()
    self._local = asyncio.ensure_future(_run_job(self._spec, self._shares[0], start))
    return start

  async def finish(self) -> PhaseResult:
    if self._spawned is not None:
      return await asyncio.to_thread(self._spawned.results)
    if self._local is None:
      raise RuntimeError("ScheduledPhase.finish before begin")
    return await self._local
