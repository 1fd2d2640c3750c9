"""Decode bursts (scheduler.num_scheduler_steps > 1), hand-worked: when the scheduler runs every
running request for several decode steps in one batch, which pages it allocates for them, and
when it falls back to a normal step."""

from __future__ import annotations

import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import DistributedConfig, EngineConfig, SchedulerConfig
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.request import Request
from jaxserve.engine.scheduler import Scheduler
from jaxserve.messages.scheduled_batch import ScheduledSeq

BURST = 4


def make_scheduler(num_pages: int = 16, page_size: int = 4, max_model_len: int = 64) -> Scheduler:
  config = SchedulerConfig(
    max_num_seqs=4,
    max_num_batched_tokens=16,
    enable_prefix_caching=False,
    num_scheduler_steps=BURST,
  )
  return Scheduler(config, PageAllocator(num_pages, page_size, False), max_model_len)


def add(scheduler: Scheduler, request_id: str, prompt, **params) -> Request:
  request = Request(request_id, list(prompt), SamplingParams(**params), seed=0)
  scheduler.add_request(request)
  return request


def deliver(scheduler: Scheduler, request: Request, num_tokens: int) -> None:
  """The engine's part: the step's sampled tokens replace the placeholders."""
  for _ in range(num_tokens):
    request.append_sampled(500 + request.num_tokens)


def test_decoding_requests_burst_with_pages_for_every_step():
  scheduler = make_scheduler()
  a = add(scheduler, "a", range(10, 16), max_tokens=20)  # 6 tokens: pages 1, 2
  b = add(scheduler, "b", range(20, 23), max_tokens=20)  # 3 tokens: page 3
  prefill = scheduler.schedule()
  assert prefill.num_steps == 1 and prefill.num_tokens == 9
  deliver(scheduler, a, 1)
  deliver(scheduler, b, 1)
  burst = scheduler.schedule()
  assert burst.num_steps == BURST
  # a feeds position 6 and writes 6..9 (a third page); b feeds 3 and writes 3..6 (a second page)
  assert burst.seqs == (
    ScheduledSeq("a", (506,), 6, (1, 2, 4), True),
    ScheduledSeq("b", (503,), 3, (3, 5), True),
  )
  assert (a.num_computed_tokens, a.num_output_placeholders) == (6 + BURST, BURST)
  assert (b.num_computed_tokens, b.num_output_placeholders) == (3 + BURST, BURST)
  deliver(scheduler, a, BURST)
  deliver(scheduler, b, BURST)
  follow = scheduler.schedule()
  assert follow.num_steps == BURST and follow.start_positions == (10, 7)


def test_a_waiting_request_gets_a_normal_step():
  scheduler = make_scheduler()
  a = add(scheduler, "a", range(10, 16), max_tokens=20)
  scheduler.schedule()
  deliver(scheduler, a, 1)
  add(scheduler, "b", range(20, 23), max_tokens=20)
  batch = scheduler.schedule()
  assert batch.num_steps == 1 and batch.request_ids == ("a", "b")


def test_requests_waiting_for_a_full_batch_do_not_stop_bursts():
  config = SchedulerConfig(
    max_num_seqs=2,
    max_num_batched_tokens=16,
    enable_prefix_caching=False,
    num_scheduler_steps=BURST,
  )
  scheduler = Scheduler(config, PageAllocator(16, 4, False), 64)
  a = add(scheduler, "a", range(10, 16), max_tokens=20)
  b = add(scheduler, "b", range(20, 23), max_tokens=20)
  add(scheduler, "c", range(30, 33), max_tokens=20)  # waits: max_num_seqs are running
  assert scheduler.schedule().request_ids == ("a", "b")
  deliver(scheduler, a, 1)
  deliver(scheduler, b, 1)
  burst = scheduler.schedule()
  assert burst.num_steps == BURST and burst.request_ids == ("a", "b")
  assert scheduler.num_waiting == 1


def test_one_request_that_cannot_burst_keeps_everyone_on_single_steps():
  for params in (dict(repetition_penalty=1.2), dict(logprobs=2), dict(min_tokens=5)):
    scheduler = make_scheduler()
    a = add(scheduler, "a", range(10, 16), max_tokens=20)
    b = add(scheduler, "b", range(20, 23), max_tokens=20, **params)
    scheduler.schedule()
    deliver(scheduler, a, 1)
    deliver(scheduler, b, 1)
    assert scheduler.schedule().num_steps == 1, params


def test_no_burst_when_its_pages_do_not_fit():
  scheduler = make_scheduler(num_pages=5)  # pages 1-4
  a = add(scheduler, "a", range(10, 18), max_tokens=8)  # pages 1, 2; a burst needs one more
  b = add(scheduler, "b", range(20, 23), max_tokens=8)  # page 3; a burst needs one more
  scheduler.schedule()
  deliver(scheduler, a, 1)
  deliver(scheduler, b, 1)
  batch = scheduler.schedule()  # one free page for the two: single steps
  assert batch.num_steps == 1 and batch.page_counts == (3, 1)


def test_a_burst_near_max_model_len_allocates_only_the_positions_still_needed():
  scheduler = make_scheduler(max_model_len=12)
  a = add(scheduler, "a", range(10, 19), max_tokens=3)  # 9 + 3 = 12 tokens: pages 1, 2, 3
  b = add(scheduler, "b", range(20, 23), max_tokens=8)  # page 4
  scheduler.schedule()
  deliver(scheduler, a, 1)
  deliver(scheduler, b, 1)
  num_free = scheduler.allocator.num_free_pages
  burst = scheduler.schedule()
  # a still samples 2 tokens (feeding positions 9, 10, both in page 3); its steps 3 and 4 feed
  # positions 11 and 12, which the device sends to its page's spare slot and nowhere
  assert burst.num_steps == BURST and burst.request_ids == ("a", "b")
  assert burst.page_counts == (3, 2) and scheduler.allocator.num_free_pages == num_free - 1


def test_samples_past_max_tokens_are_allowed_and_finished_requests_are_left_out():
  scheduler = make_scheduler()
  a = add(scheduler, "a", range(10, 16), max_tokens=2)  # one more token after the prefill
  b = add(scheduler, "b", range(20, 23), max_tokens=20)
  scheduler.schedule()
  deliver(scheduler, a, 1)
  deliver(scheduler, b, 1)
  burst = scheduler.schedule()  # a's last 3 samples will be dropped by the engine
  assert burst.num_steps == BURST and burst.request_ids == ("a", "b")
  follow = scheduler.schedule()  # a has all its tokens in flight: only b goes on
  assert follow.num_steps == BURST and follow.request_ids == ("b",)


def test_when_every_request_ends_within_a_burst_single_steps_finish_them():
  scheduler = make_scheduler()
  a = add(scheduler, "a", range(10, 16), max_tokens=4)  # 3 more samples after the prefill
  b = add(scheduler, "b", range(20, 23), max_tokens=3)  # 2 more
  scheduler.schedule()
  deliver(scheduler, a, 1)
  deliver(scheduler, b, 1)
  step = scheduler.schedule()
  assert step.num_steps == 1 and step.request_ids == ("a", "b")


def test_num_scheduler_steps_is_validated():
  with pytest.raises(ValueError, match=r"num_scheduler_steps: must be an integer in \[1, 64\]"):
    SchedulerConfig(num_scheduler_steps=0)
  with pytest.raises(
    ValueError, match="scheduler.num_scheduler_steps: decode bursts do not run on multi-host jobs"
  ):
    EngineConfig(
      scheduler=SchedulerConfig(num_scheduler_steps=4), distributed=DistributedConfig(enabled=True)
    )
