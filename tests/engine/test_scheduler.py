"""Scheduler: hand-worked scenarios with exact expected batches.

The simulated engine samples token 500 + (number of known tokens) for each sampling sequence and
finishes a request once it has max_tokens outputs. Page ids follow the allocator's order: free
pages are handed out lowest first at start, freed pages are appended to the free list (a
sequence's pages tail first), and evictable cached pages are used only when no plain page is left.
"""

from __future__ import annotations

import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import SchedulerConfig
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.engine.scheduler import Scheduler
from jaxserve.messages.scheduled_batch import ScheduledBatch, ScheduledSeq


def make_scheduler(
  num_pages: int,
  page_size: int,
  max_num_seqs: int = 4,
  max_num_batched_tokens: int = 16,
  chunked: bool = True,
  prefix_caching: bool = False,
  max_model_len: int = 256,
  prefill_first: bool = False,
  mixed_step_prefill_tokens: int | None = None,
) -> Scheduler:
  config = SchedulerConfig(
    max_num_seqs=max_num_seqs,
    max_num_batched_tokens=max_num_batched_tokens,
    enable_chunked_prefill=chunked,
    enable_prefix_caching=prefix_caching,
    prefill_first=prefill_first,
    mixed_step_prefill_tokens=mixed_step_prefill_tokens,
  )
  return Scheduler(config, PageAllocator(num_pages, page_size, prefix_caching), max_model_len)


def make_request(
  request_id: str, prompt, max_tokens: int, prompt_logprobs: int | None = None
) -> Request:
  params = SamplingParams(max_tokens=max_tokens, prompt_logprobs=prompt_logprobs)
  return Request(request_id, list(prompt), params, seed=0)


def step(scheduler: Scheduler) -> ScheduledBatch:
  batch = scheduler.schedule()
  for seq in batch.seqs:
    if seq.sample:
      request = scheduler.get_request(seq.request_id)
      request.append_sampled(500 + request.num_tokens)
      if len(request.output_token_ids) >= request.sampling_params.max_tokens:
        scheduler.finish_request(seq.request_id, RequestStatus.FINISHED_LENGTH)
  return batch


def seq(request_id: str, token_ids, start: int, page_ids, sample: bool) -> ScheduledSeq:
  return ScheduledSeq(request_id, tuple(token_ids), start, tuple(page_ids), sample)


def test_prefill_then_decode_until_max_tokens():
  scheduler = make_scheduler(num_pages=8, page_size=4)
  request = make_request("a", range(10, 16), max_tokens=3)
  scheduler.add_request(request)
  assert step(scheduler).seqs == (seq("a", range(10, 16), 0, (1, 2), True),)
  assert request.status is RequestStatus.RUNNING and request.output_token_ids == [506]
  assert step(scheduler).seqs == (seq("a", [506], 6, (1, 2), True),)
  assert step(scheduler).seqs == (seq("a", [507], 7, (1, 2), True),)
  assert request.output_token_ids == [506, 507, 508]
  assert request.status is RequestStatus.FINISHED_LENGTH and request.page_ids == []
  assert scheduler.get_request("a") is None and not scheduler.has_unfinished_requests()
  assert scheduler.allocator.num_used_pages == 0
  assert step(scheduler).is_empty


def test_decodes_come_before_prefill_chunks():
  scheduler = make_scheduler(num_pages=16, page_size=4, max_num_seqs=2, max_num_batched_tokens=8)
  scheduler.add_request(make_request("x", range(12), max_tokens=2))
  scheduler.add_request(make_request("y", [50], max_tokens=2))
  assert step(scheduler).seqs == (seq("x", range(8), 0, (1, 2), False),)
  assert scheduler.num_waiting == 1
  # y's one-token prompt is a single-token query that samples: it goes before x's chunk.
  assert step(scheduler).seqs == (
    seq("y", [50], 0, (4,), True),
    seq("x", range(8, 12), 8, (1, 2, 3), True),
  )
  assert step(scheduler).seqs == (
    seq("x", [512], 12, (1, 2, 3, 5), True),
    seq("y", [501], 1, (4,), True),
  )
  assert not scheduler.has_unfinished_requests()


def test_chunked_prefill_splits_long_prompt():
  scheduler = make_scheduler(num_pages=16, page_size=4, max_num_seqs=2, max_num_batched_tokens=8)
  scheduler.add_request(make_request("a", range(20), max_tokens=2))
  assert step(scheduler).seqs == (seq("a", range(8), 0, (1, 2), False),)
  assert step(scheduler).seqs == (seq("a", range(8, 16), 8, (1, 2, 3, 4), False),)
  assert step(scheduler).seqs == (seq("a", range(16, 20), 16, (1, 2, 3, 4, 5), True),)
  assert step(scheduler).seqs == (seq("a", [520], 20, (1, 2, 3, 4, 5, 6), True),)
  assert not scheduler.has_unfinished_requests()


def test_without_chunked_prefill_prompts_fit_whole():
  scheduler = make_scheduler(
    num_pages=16, page_size=4, max_num_seqs=2, max_num_batched_tokens=8, chunked=False
  )
  scheduler.add_request(make_request("a", range(6), max_tokens=2))
  scheduler.add_request(make_request("b", range(10, 15), max_tokens=2))
  assert step(scheduler).seqs == (seq("a", range(6), 0, (1, 2), True),)
  assert scheduler.num_waiting == 1
  assert step(scheduler).seqs == (
    seq("a", [506], 6, (1, 2), True),
    seq("b", range(10, 15), 0, (3, 4), True),
  )
  with pytest.raises(ValueError, match="prompt: 9 tokens exceed scheduler.max_num_batched_tokens"):
    scheduler.add_request(make_request("c", range(9), max_tokens=1))


def test_preempts_most_recent_request_and_resumes_with_prompt_plus_output():
  scheduler = make_scheduler(num_pages=5, page_size=2, max_num_seqs=2)
  a, b = make_request("a", [1, 2, 3], max_tokens=4), make_request("b", [4, 5, 6], max_tokens=4)
  scheduler.add_request(a)
  scheduler.add_request(b)
  assert step(scheduler).seqs == (
    seq("a", [1, 2, 3], 0, (1, 2), True),
    seq("b", [4, 5, 6], 0, (3, 4), True),
  )
  assert step(scheduler).seqs == (
    seq("a", [503], 3, (1, 2), True),
    seq("b", [503], 3, (3, 4), True),
  )
  batch = step(scheduler)  # a needs a third page: b, the most recent, is preempted
  assert batch == ScheduledBatch.of((seq("a", [504], 4, (1, 2, 4), True),), ("b",))
  assert b.status is RequestStatus.WAITING and b.page_ids == [] and b.num_computed_tokens == 0
  assert b.num_preemptions == 1 and scheduler.num_preemptions_total == 1
  assert b.output_token_ids == [503, 504]
  # b needs 3 pages to recompute, 1 is free: a runs alone and finishes.
  assert step(scheduler).seqs == (seq("a", [505], 5, (1, 2, 4), True),)
  assert a.status is RequestStatus.FINISHED_LENGTH
  assert step(scheduler).seqs == (seq("b", [4, 5, 6, 503, 504], 0, (3, 4, 2), True),)
  assert step(scheduler).seqs == (seq("b", [505], 5, (3, 4, 2), True),)
  assert b.output_token_ids == [503, 504, 505, 506]
  assert not scheduler.has_unfinished_requests() and scheduler.allocator.num_used_pages == 0


def test_request_that_is_most_recent_preempts_itself():
  scheduler = make_scheduler(num_pages=4, page_size=2, max_num_seqs=2)
  a, b = make_request("a", [1, 2, 3], max_tokens=2), make_request("b", [7, 8], max_tokens=2)
  scheduler.add_request(a)
  scheduler.add_request(b)
  assert step(scheduler).seqs == (
    seq("a", [1, 2, 3], 0, (1, 2), True),
    seq("b", [7, 8], 0, (3,), True),
  )
  batch = step(scheduler)
  assert batch == ScheduledBatch.of((seq("a", [503], 3, (1, 2), True),), ("b",))
  assert a.status is RequestStatus.FINISHED_LENGTH
  assert step(scheduler).seqs == (seq("b", [7, 8, 502], 0, (3, 2), True),)
  assert not scheduler.has_unfinished_requests()


def test_admission_keeps_a_page_for_decodes_crossing_a_page_boundary():
  scheduler = make_scheduler(num_pages=5, page_size=2, max_num_seqs=2)
  scheduler.add_request(make_request("a", [1, 2, 3, 4], max_tokens=3))
  scheduler.add_request(make_request("b", [5, 6, 7], max_tokens=2))
  # b would fit now (2 free pages), but a's next token needs one of them.
  assert step(scheduler).seqs == (seq("a", [1, 2, 3, 4], 0, (1, 2), True),)
  assert step(scheduler).seqs == (seq("a", [504], 4, (1, 2, 3), True),)
  assert step(scheduler).seqs == (seq("a", [505], 5, (1, 2, 3), True),)
  assert step(scheduler).seqs == (seq("b", [5, 6, 7], 0, (4, 3), True),)
  assert scheduler.num_preemptions_total == 0


def test_resumed_request_longer_than_a_step_without_chunked_prefill():
  scheduler = make_scheduler(
    num_pages=5, page_size=2, max_num_seqs=2, max_num_batched_tokens=2, chunked=False
  )
  a, b = make_request("a", [1, 2], max_tokens=4), make_request("b", [3], max_tokens=5)
  scheduler.add_request(a)
  scheduler.add_request(b)
  assert step(scheduler).seqs == (seq("a", [1, 2], 0, (1,), True),)
  assert step(scheduler).seqs == (seq("a", [502], 2, (1, 2), True), seq("b", [3], 0, (3,), True))
  assert step(scheduler).seqs == (seq("a", [503], 3, (1, 2), True), seq("b", [501], 1, (3,), True))
  batch = step(scheduler)
  assert batch == ScheduledBatch.of((seq("a", [504], 4, (1, 2, 4), True),), ("b",))
  assert a.status is RequestStatus.FINISHED_LENGTH
  # b now knows 3 tokens, more than a step holds: it is recomputed in chunks.
  assert step(scheduler).seqs == (seq("b", [3, 501], 0, (3,), False),)
  assert step(scheduler).seqs == (seq("b", [502], 2, (3, 4), True),)
  assert b.output_token_ids == [501, 502, 503]


def test_prefix_cache_hit_after_finish_skips_computation():
  scheduler = make_scheduler(num_pages=16, page_size=4, prefix_caching=True)
  scheduler.add_request(make_request("a", range(10), max_tokens=1))
  assert step(scheduler).seqs == (seq("a", range(10), 0, (1, 2, 3), True),)
  assert scheduler.allocator.num_used_pages == 0 and scheduler.allocator.num_cached_pages == 2
  b = make_request("b", list(range(10)) + [77, 78], max_tokens=2)
  scheduler.add_request(b)
  assert step(scheduler).seqs == (seq("b", [8, 9, 77, 78], 8, (1, 2, 4), True),)
  assert [scheduler.allocator.refcount(p) for p in (1, 2, 4)] == [1, 1, 1]


def test_prefix_cache_shared_with_running_request():
  scheduler = make_scheduler(num_pages=16, page_size=4, max_num_seqs=2, prefix_caching=True)
  a = make_request("a", range(9), max_tokens=4)
  scheduler.add_request(a)
  assert step(scheduler).seqs == (seq("a", range(9), 0, (1, 2, 3), True),)
  b = make_request("b", list(range(9)) + [60], max_tokens=4)
  scheduler.add_request(b)
  assert step(scheduler).seqs == (
    seq("a", [509], 9, (1, 2, 3), True),
    seq("b", [8, 60], 8, (1, 2, 4), True),
  )
  assert [scheduler.allocator.refcount(p) for p in (1, 2, 3, 4)] == [2, 2, 1, 1]
  assert scheduler.abort_request("a")
  assert [scheduler.allocator.refcount(p) for p in (1, 2, 3, 4)] == [1, 1, 0, 1]
  scheduler.allocator.check_invariants(owners=[b.page_ids])


def test_requests_admitted_together_share_the_prompts_full_pages():
  """The n choices of one prompt (expanded into n requests added together): the first computes
  the prompt, the others take its two full pages in the same step and compute only the tokens
  of the last, partial page, each into a page of its own."""
  scheduler = make_scheduler(num_pages=16, page_size=4, prefix_caching=True)
  for request_id in "abc":
    scheduler.add_request(make_request(request_id, range(10), max_tokens=2))
  assert step(scheduler).seqs == (
    seq("a", range(10), 0, (1, 2, 3), True),
    seq("b", [8, 9], 8, (1, 2, 4), True),
    seq("c", [8, 9], 8, (1, 2, 5), True),
  )
  # 5 pages held, not 9; 14 prompt tokens computed, not 30
  assert scheduler.allocator.num_used_pages == 5
  assert [scheduler.allocator.refcount(p) for p in (1, 2, 3, 4, 5)] == [3, 3, 1, 1, 1]
  assert (scheduler.prefix_cache_queries, scheduler.prefix_cache_hits) == (30, 16)
  step(scheduler)  # each decodes its last token and finishes
  assert scheduler.allocator.num_used_pages == 0
  scheduler.allocator.check_invariants(owners=[])


def test_without_prefix_caching_requests_admitted_together_share_nothing():
  scheduler = make_scheduler(num_pages=16, page_size=4, max_num_batched_tokens=32)
  for request_id in "abc":
    scheduler.add_request(make_request(request_id, range(10), max_tokens=2))
  batch = step(scheduler)
  assert [s.num_tokens for s in batch.seqs] == [10, 10, 10]
  assert scheduler.allocator.num_used_pages == 9
  assert (scheduler.prefix_cache_queries, scheduler.prefix_cache_hits) == (0, 0)


def test_prefix_cache_never_covers_last_token():
  scheduler = make_scheduler(num_pages=16, page_size=4, prefix_caching=True)
  scheduler.add_request(make_request("a", range(8), max_tokens=1))
  assert step(scheduler).seqs == (seq("a", range(8), 0, (1, 2), True),)
  scheduler.add_request(make_request("b", range(8), max_tokens=1))
  assert step(scheduler).seqs == (seq("b", range(4, 8), 4, (1, 3), True),)


def test_prefix_cache_skipped_for_prompt_logprobs():
  scheduler = make_scheduler(num_pages=16, page_size=4, prefix_caching=True)
  scheduler.add_request(make_request("a", range(9), max_tokens=1))
  assert step(scheduler).seqs == (seq("a", range(9), 0, (1, 2, 3), True),)
  scheduler.add_request(make_request("c", range(9), max_tokens=1, prompt_logprobs=1))
  assert step(scheduler).seqs == (seq("c", range(9), 0, (4, 5, 6), True),)


def test_prefix_cache_counts_queried_and_hit_tokens():
  """vLLM's prefix cache counters, in tokens: an admission that reads the cache queries its
  known tokens and hits those its cached pages cover; prompt_logprobs requests do not read it."""
  scheduler = make_scheduler(num_pages=16, page_size=4, prefix_caching=True)
  scheduler.add_request(make_request("a", range(10), max_tokens=1))
  step(scheduler)
  assert (scheduler.prefix_cache_queries, scheduler.prefix_cache_hits) == (10, 0)
  scheduler.add_request(make_request("b", list(range(10)) + [77, 78], max_tokens=1))
  step(scheduler)
  assert (scheduler.prefix_cache_queries, scheduler.prefix_cache_hits) == (22, 8)
  scheduler.add_request(make_request("c", range(9), max_tokens=1, prompt_logprobs=1))
  step(scheduler)
  assert (scheduler.prefix_cache_queries, scheduler.prefix_cache_hits) == (22, 8)
  plain = make_scheduler(num_pages=16, page_size=4)
  plain.add_request(make_request("a", range(10), max_tokens=1))
  step(plain)
  assert (plain.prefix_cache_queries, plain.prefix_cache_hits) == (0, 0)


def test_add_request_refusals_name_the_field():
  scheduler = make_scheduler(num_pages=5, page_size=4, max_model_len=20)
  with pytest.raises(ValueError, match="^prompt: "):
    scheduler.add_request(make_request("a", [], max_tokens=1))
  with pytest.raises(
    ValueError,
    match=r"prompt: 10 prompt tokens \+ max_tokens 11 = 21 "
    r"exceeds max_model_len 20",
  ):
    scheduler.add_request(make_request("a", range(10), max_tokens=11))
  with pytest.raises(ValueError, match=r"max_tokens: .*needs 5 KV cache pages .* has 4"):
    scheduler.add_request(make_request("a", range(10), max_tokens=7))
  # the same rules, checked without queueing (the core's 429 path checks before refusing)
  with pytest.raises(ValueError, match=r"max_tokens: .*needs 5 KV cache pages .* has 4"):
    scheduler.check_servable(10, 7)
  scheduler.check_servable(10, 6)
  assert scheduler.num_waiting == 0
  scheduler.add_request(make_request("a", range(10), max_tokens=6))
  with pytest.raises(ValueError, match="request_id"):
    scheduler.add_request(make_request("a", range(3), max_tokens=1))
  holding = make_request("b", range(3), max_tokens=1)
  holding.page_ids = [1]
  with pytest.raises(ValueError, match="page_ids"):
    scheduler.add_request(holding)
  assert scheduler.num_waiting == 1


def test_constructor_refusals():
  config = SchedulerConfig(enable_prefix_caching=True)
  with pytest.raises(ValueError, match="enable_prefix_caching"):
    Scheduler(config, PageAllocator(8, 4), max_model_len=16)
  with pytest.raises(ValueError, match="max_model_len"):
    Scheduler(SchedulerConfig(enable_prefix_caching=False), PageAllocator(8, 4), max_model_len=0)


def test_abort_while_waiting_and_running_frees_pages():
  scheduler = make_scheduler(num_pages=8, page_size=4, max_num_seqs=1)
  a, b = make_request("a", range(5), max_tokens=4), make_request("b", range(5), max_tokens=4)
  scheduler.add_request(a)
  scheduler.add_request(b)
  step(scheduler)
  assert scheduler.num_running == 1 and scheduler.num_waiting == 1
  assert scheduler.allocator.num_used_pages == 2
  assert scheduler.abort_request("b")
  assert b.status is RequestStatus.FINISHED_ABORTED and scheduler.num_waiting == 0
  assert scheduler.abort_request("a")
  assert a.status is RequestStatus.FINISHED_ABORTED and a.page_ids == []
  assert scheduler.allocator.num_used_pages == 0 and not scheduler.has_unfinished_requests()
  assert not scheduler.abort_request("a") and not scheduler.abort_request("nope")
  assert step(scheduler).is_empty


def test_finish_request_refusals():
  scheduler = make_scheduler(num_pages=8, page_size=4)
  scheduler.add_request(make_request("a", range(5), max_tokens=4))
  with pytest.raises(ValueError, match="status"):
    scheduler.finish_request("a", RequestStatus.RUNNING)
  with pytest.raises(ValueError, match="request_id"):
    scheduler.finish_request("nope", RequestStatus.FINISHED_STOPPED)
  scheduler.finish_request("a", RequestStatus.FINISHED_STOPPED)
  assert not scheduler.has_unfinished_requests()


def test_max_num_seqs_limits_running_requests():
  scheduler = make_scheduler(num_pages=16, page_size=4, max_num_seqs=2)
  for name in "abc":
    scheduler.add_request(make_request(name, range(3), max_tokens=2))
  assert [s.request_id for s in step(scheduler).seqs] == ["a", "b"]
  assert scheduler.num_running == 2 and scheduler.num_waiting == 1
  assert [s.request_id for s in step(scheduler).seqs] == ["a", "b"]
  assert [s.request_id for s in step(scheduler).seqs] == ["c"]
  assert scheduler.kv_cache_usage == pytest.approx(1 / 15)


def test_prefill_first_runs_prefill_steps_while_prompts_can_be_admitted():
  scheduler = make_scheduler(
    num_pages=32, page_size=4, max_num_seqs=3, max_num_batched_tokens=8, prefill_first=True
  )
  scheduler.add_request(make_request("a", range(6), max_tokens=3))
  assert step(scheduler).seqs == (seq("a", range(6), 0, (1, 2), True),)
  scheduler.add_request(make_request("b", range(20, 30), max_tokens=2))
  scheduler.add_request(make_request("c", range(40, 43), max_tokens=2))
  # a decodes, but b can be admitted: b's first chunk alone (c does not fit the budget left)
  assert step(scheduler).seqs == (seq("b", range(20, 28), 0, (3, 4), False),)
  # b's last chunk and c's prompt; a still waits
  assert step(scheduler).seqs == (
    seq("b", range(28, 30), 8, (3, 4, 5), True),
    seq("c", range(40, 43), 0, (6,), True),
  )
  # nothing left to prefill: everyone decodes
  assert step(scheduler).seqs == (
    seq("a", [506], 6, (1, 2), True),
    seq("b", [510], 10, (3, 4, 5), True),
    seq("c", [503], 3, (6,), True),
  )


def test_prefill_first_decodes_once_max_num_seqs_are_running():
  scheduler = make_scheduler(
    num_pages=32, page_size=4, max_num_seqs=1, max_num_batched_tokens=8, prefill_first=True
  )
  scheduler.add_request(make_request("a", range(4), max_tokens=2))
  scheduler.add_request(make_request("b", range(10, 14), max_tokens=1))
  assert step(scheduler).seqs == (seq("a", range(4), 0, (1,), True),)
  assert step(scheduler).seqs == (seq("a", [504], 4, (1, 2), True),)  # b cannot be admitted
  assert step(scheduler).seqs == (seq("b", range(10, 14), 0, (3,), True),)
  assert not scheduler.has_unfinished_requests() and scheduler.allocator.num_used_pages == 0


def _chunks(batch: ScheduledBatch) -> list[tuple[str, int, int, bool]]:
  return [(s.request_id, s.start_position, s.num_tokens, s.sample) for s in batch.seqs]


def test_a_step_that_decodes_carries_the_prompt_tokens_its_idle_slots_allow():
  """Budget 16, 4 slots, mixed_step_prefill_tokens 6: with D decoding, the prompt tokens stop at
  max(6, 16 x (4 - D) / 4): 12 at D = 1, 8 at D = 2, 6 at D = 3 (the setting binds)."""
  scheduler = make_scheduler(
    num_pages=64, page_size=4, max_num_batched_tokens=16, mixed_step_prefill_tokens=6
  )
  scheduler.add_request(make_request("a", range(3), max_tokens=20))
  assert _chunks(step(scheduler)) == [("a", 0, 3, True)]  # nothing decodes: the whole budget
  scheduler.add_request(make_request("b", range(100, 120), max_tokens=20))
  assert _chunks(step(scheduler)) == [("a", 3, 1, True), ("b", 0, 12, False)]
  assert _chunks(step(scheduler)) == [("a", 4, 1, True), ("b", 12, 8, True)]
  scheduler.add_request(make_request("c", range(200, 210), max_tokens=20))
  scheduler.add_request(make_request("d", range(300, 320), max_tokens=20))
  assert _chunks(step(scheduler)) == [("a", 5, 1, True), ("b", 20, 1, True), ("c", 0, 8, False)]
  assert scheduler.num_waiting == 1  # d waits: the 8 are spent
  assert _chunks(step(scheduler)) == [
    ("a", 6, 1, True),
    ("b", 21, 1, True),
    ("c", 8, 2, True),
    ("d", 0, 6, False),
  ]
  assert _chunks(step(scheduler)) == [  # 3 decode: 6 prompt tokens, not 16 x 1 / 4
    ("a", 7, 1, True),
    ("b", 22, 1, True),
    ("c", 10, 1, True),
    ("d", 6, 6, False),
  ]


def test_mixed_step_prefill_tokens_is_validated():
  for bad in (0, -3, 2.5, "many"):
    with pytest.raises(ValueError, match="scheduler.mixed_step_prefill_tokens"):
      SchedulerConfig(mixed_step_prefill_tokens=bad)
