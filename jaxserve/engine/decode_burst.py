"""Decode bursts (scheduler.num_scheduler_steps = K > 1): planning a step that decodes K tokens
per request in one dispatch. Pure Python, no jax; functions over the scheduler's running queue
and its pages (engine/kv_groups.py), called by `Scheduler.schedule` (engine/scheduler.py).

When no request waits for admission (or none could be admitted: max_num_seqs are running) and
every running request that still samples decodes one token with sampling a burst can run
(Request.can_burst: no penalties, top-N logprobs or pending min_tokens), the step is a burst
instead, unless every one of them has fewer than K samples left (single steps then finish them
without computing steps nobody needs): each of them feeds its one token and the device runs K
decode steps, each feeding the token the step before sampled. Their pages cover the positions
they still need (all K, or up to max_tokens), num_computed_tokens advances by K and K output
placeholders are counted; samples past max_tokens or after a stop are dropped by the engine. A
burst never preempts: if its pages do not fit, or a request cannot burst, a normal step runs
instead.

Contracts. The caller checks the waiting-queue condition; `schedule_burst` checks the rest and
returns None (nothing allocated, nothing advanced) when a normal step must run instead. With
sliding-window KV groups it first releases each bursting request's pages wholly before its next
query's window, as a normal step would before scheduling it, whether or not the burst then fits.
A request with fewer than K samples left gets pages only for those: the device sends its later
steps' K/V to the null page (or, past the block table, nowhere) and the engine drops what they
sample, as it drops samples after a stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..config import SchedulerConfig  # relative imports: this side never touches jax
from ..messages.scheduled_batch import ScheduledBatch
from .batch_builder import BatchBuilder
from .kv_groups import KVGroupPages
from .request import Request


class BurstRow(NamedTuple):
  """One bursting request: the positions it still needs (at most K) and the pages they need
  beyond those it holds, over all KV groups (a named tuple: one per request per burst)."""

  request: Request
  num_new: int
  num_pages: int


def schedule_burst(
  running: Sequence[Request], config: SchedulerConfig, pages: KVGroupPages
) -> ScheduledBatch | None:
  """Every running request that still samples decodes K tokens in one dispatch; None (a normal
  step follows) unless each of them feeds exactly one token, may burst (Request.can_burst), the
  pages for the positions it still needs can be allocated without preempting anyone, and at
  least one of them still samples K tokens or more."""
  rows = plan_burst(running, config, pages)
  if rows is None:
    return None
  return build_burst(rows, config.num_scheduler_steps, pages)


def plan_burst(
  running: Sequence[Request], config: SchedulerConfig, pages: KVGroupPages
) -> list[BurstRow] | None:
  """The burst's rows, in running order, once its pages are known to fit; None if it can't run."""
  bursting = bursting_requests(running, config)
  if bursting is None:
    return None
  if pages.windows:
    for request in bursting:
      pages.release_outside_windows(request)
  num_steps = config.num_scheduler_steps
  rows = []
  for request in bursting:
    num_new = min(num_steps, request.max_total_tokens - request.num_tokens_with_placeholders)
    num_pages = pages.num_new_pages(request, request.num_computed_tokens + num_new)
    rows.append(BurstRow(request, num_new, num_pages))
  if not pages.allocator.can_allocate(sum(row.num_pages for row in rows)):
    return None
  return rows


def bursting_requests(running: Sequence[Request], config: SchedulerConfig) -> list[Request] | None:
  """The running requests that still sample, if they may burst together; else None."""
  num_steps = config.num_scheduler_steps
  bursting = [r for r in running if r.num_tokens_with_placeholders < r.max_total_tokens]
  if not bursting or len(bursting) > min(config.max_num_seqs, config.max_num_batched_tokens):
    return None
  if max(r.max_total_tokens - r.num_tokens_with_placeholders for r in bursting) < num_steps:
    return None  # every request ends within the burst: single steps compute no extra step
  for request in bursting:
    if (
      request.num_tokens_with_placeholders - request.num_computed_tokens != 1
      or not request.can_burst()
    ):
      return None
  return bursting


def build_burst(rows: Sequence[BurstRow], num_steps: int, pages: KVGroupPages) -> ScheduledBatch:
  """Allocates the rows' pages, advances each request by num_steps computed tokens and output
  placeholders, and returns the burst's batch."""
  decodes: list[tuple[Request, int]] = []
  for row in rows:
    request = row.request
    if row.num_pages:
      pages.allocate(request, request.num_computed_tokens + row.num_new)
    decodes.append((request, request.num_computed_tokens))
    request.num_computed_tokens += num_steps
    request.num_output_placeholders += num_steps
  builder = BatchBuilder(pages.num_groups)
  builder.add_decodes(decodes)
  return builder.build([], num_steps)
