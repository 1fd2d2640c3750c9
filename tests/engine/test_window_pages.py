"""Window-aware pages on the host: a Gemma-3-like layout (one global group, five sliding groups of
a window that ends inside a page), counted from the request's block tables and from the
allocator after every schedule. Expected counts are worked out here from the positions alone.
"""

from __future__ import annotations

import math

import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import SchedulerConfig
from jaxserve.engine.kv_groups import KVGroupPages
from jaxserve.engine.page_allocator import PageAllocator, extend_page_hashes
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.engine.scheduler import Scheduler
from jaxserve.messages.kv_layout import KVGroupSpec, KVLayout

PAGE, WINDOW, CHUNK = 16, 40, 64
NUM_SLIDING = 5
# pages a sliding group may hold: a chunk's and the window's before its first query
SLIDING_BOUND = math.ceil((WINDOW - 1 + CHUNK) / PAGE) + 1  # 8
DECODE_BOUND = math.ceil(WINDOW / PAGE) + 1  # 4: a one-token query and its window


def gemma3_like(page_size: int = PAGE) -> KVLayout:
  """Gemma 3's pattern (5 sliding layers, then a global one) over 12 layers: 2 slots, 6 groups."""
  sliding = [layer for layer in range(12) if layer % 6 != 5]
  groups = [KVGroupSpec(None, (5, 11))]
  groups += [KVGroupSpec(WINDOW, tuple(sliding[i : i + 2])) for i in range(0, 10, 2)]
  return KVLayout(page_size, tuple(groups))


def make_scheduler(num_pages: int, prefix_caching: bool = False, **fields) -> Scheduler:
  config = SchedulerConfig(
    max_num_seqs=4,
    max_num_batched_tokens=CHUNK,
    enable_prefix_caching=prefix_caching,
    **fields,
  )
  allocator = PageAllocator(num_pages, PAGE, prefix_caching)
  return Scheduler(config, allocator, 4096, gemma3_like())


def make_request(request_id: str, prompt: list[int], max_tokens: int) -> Request:
  return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens), seed=0)


def step(scheduler: Scheduler):
  """One schedule; every sampling sequence gets token 7 and finishes at max_tokens."""
  batch = scheduler.schedule()
  for seq in batch.seqs:
    if seq.sample:
      request = scheduler.get_request(seq.request_id)
      request.append_sampled(7)
      if len(request.output_token_ids) >= request.sampling_params.max_tokens:
        scheduler.finish_request(seq.request_id, RequestStatus.FINISHED_LENGTH)
  return batch


def check_pool(scheduler: Scheduler, running: list[Request]) -> None:
  """Every held page in exactly one place, in its own group's tables."""
  allocator = scheduler.allocator
  window_owners = [[r.window_page_ids[k] for r in running] for k in range(NUM_SLIDING)]
  allocator.check_invariants([r.page_ids for r in running], window_owners)


def held(table: list[int]) -> int:
  return sum(page != 0 for page in table)


def test_global_pages_grow_with_the_context_sliding_pages_stay_at_the_window():
  scheduler = make_scheduler(num_pages=200)
  allocator = scheduler.allocator
  request = make_request("long", list(range(1, 601)), max_tokens=60)
  scheduler.add_request(request)
  num_steps, most_sliding = 0, 0
  while not request.finished:
    batch = step(scheduler)
    num_steps += 1
    if request.finished:
      break
    [seq] = batch.seqs
    computed = request.num_computed_tokens
    # counted from the tables
    assert len(request.page_ids) == math.ceil(computed / PAGE)
    assert all(len(t) == len(request.page_ids) for t in request.window_page_ids)
    bound = DECODE_BOUND if seq.num_tokens == 1 else SLIDING_BOUND
    for table in request.window_page_ids:
      assert held(table) <= bound
      # nothing before the window of the query that starts the step is held
      first_seen = max(0, seq.start_position - WINDOW + 1) // PAGE
      assert all(page == 0 for page in table[:first_seen])
    # counted from the allocator
    assert allocator.num_used_pages_in(0) == math.ceil(computed / PAGE)
    for group, table in enumerate(request.window_page_ids, 1):
      assert allocator.num_used_pages_in(group) == held(table)
    assert allocator.num_used_pages == math.ceil(computed / PAGE) + sum(
      held(t) for t in request.window_page_ids
    )
    most_sliding = max(most_sliding, *(held(t) for t in request.window_page_ids))
    check_pool(scheduler, [request])
  assert num_steps == 600 // CHUNK + 1 + 59  # prefill chunks, then one token a step
  assert request.num_tokens == 660 and len(request.output_token_ids) == 60
  # at the end the global group held the whole context (42 pages), each sliding group at most
  # the window's pages, and nothing is left
  assert math.ceil(659 / PAGE) == 42 and most_sliding <= SLIDING_BOUND
  assert allocator.num_used_pages == 0
  check_pool(scheduler, [])


def test_a_request_fits_the_pool_by_its_windows_and_one_that_never_fits_is_refused():
  # 600 + 60 tokens: 42 global pages + 5 * 8 sliding = 82 pages at most, not 6 * 42 = 252
  scheduler = make_scheduler(num_pages=83)
  request = make_request("fits", list(range(1, 601)), max_tokens=60)
  scheduler.add_request(request)
  while not request.finished:
    step(scheduler)
  assert scheduler.num_preemptions_total == 0
  too_long = make_request("too-long", list(range(1, 614)), max_tokens=60)  # 43 global pages
  with pytest.raises(ValueError, match=r"needs 83 KV cache pages in its 6 KV groups .* has 82"):
    scheduler.add_request(too_long)


def test_a_prefix_hit_longer_than_the_window_takes_the_windows_pages_only():
  scheduler = make_scheduler(num_pages=200, prefix_caching=True)
  allocator = scheduler.allocator
  prompt = list(range(1, 201))  # 12.5 pages
  first = make_request("first", prompt, max_tokens=2)
  scheduler.add_request(first)
  first_tables: dict[tuple[int, int], int] = {}  # (group, index) -> the page first held there
  while not first.finished:
    [seq] = step(scheduler).seqs
    for group, table in enumerate([seq.page_ids, *seq.window_page_ids]):
      first_tables.update({(group, i): p for i, p in enumerate(table) if p})
  assert allocator.num_used_pages == 0
  second = make_request("second", prompt[:190] + [999] * 30, max_tokens=1)
  scheduler.add_request(second)
  batch = step(scheduler)
  # 11 full pages are shared (176 tokens); the next query at 176 sees back to 137: page 8 on
  [seq] = batch.seqs
  assert seq.start_position == 176
  assert seq.page_ids[:11] == tuple(first_tables[0, i] for i in range(11))
  for group, table in enumerate(seq.window_page_ids, 1):
    # null below the window; pages 8-10 shared (the first released 8 and 9 on its way)
    assert table[:8] == (0,) * 8 and 0 not in table[8:]
    assert table[8:11] == tuple(first_tables[group, i] for i in range(8, 11))
    assert all(allocator.group_of(p) == group for p in table[8:])
  check_pool(scheduler, [second])


def test_the_hit_shrinks_to_what_every_window_can_serve():
  """Group 0 caches 6 pages but a sliding group (window 8 on 4-token pages) only pages 0-2:
  a hit of L pages needs the sliding pages [(4L - 7) // 4, L): L = 3 (pages 1, 2) is the most."""
  allocator = PageAllocator(32, 4, enable_prefix_caching=True)
  tokens = list(range(100, 124))  # 6 full pages
  hashes: list[bytes] = []
  extend_page_hashes(hashes, tokens, 4)
  full, sliding = allocator.allocate(6), allocator.allocate(3, group=1)
  for index, page_hash in enumerate(hashes):
    allocator.register(0, page_hash, full[index])
    if index < 3:
      allocator.register(1, page_hash, sliding[index])
  pages = KVGroupPages(allocator, (8,))
  request = make_request("hit", tokens + [1], max_tokens=1)
  pages.clear(request)
  assert pages.take_cached_prefix(request, hashes) == 3
  assert request.page_ids == full[:3]
  assert request.window_page_ids == [[0, sliding[1], sliding[2]]]
  assert [allocator.refcount(p) for p in full] == [2, 2, 2, 1, 1, 1]
  assert [allocator.refcount(p) for p in sliding] == [1, 2, 2]
