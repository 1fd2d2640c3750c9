"""Priority scheduling (scheduler.policy "priority", engine/request_queue.py), as vLLM's
`--scheduling-policy priority`: a lower priority value is admitted first, ties by arrival; the
running list follows the same order, so the least urgent request is preempted first and the most
urgent last. Under fcfs a non-zero priority is refused. Pure host code, hand-worked cases."""

from __future__ import annotations

import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import SchedulerConfig
from jaxserve.engine.admission import check_priority
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.engine.request_queue import FcfsQueue, PriorityQueue
from jaxserve.engine.scheduler import Scheduler
from tests.engine.test_scheduler import step


def make_scheduler(num_pages: int, max_num_seqs: int, budget: int = 16) -> Scheduler:
  config = SchedulerConfig(
    max_num_seqs=max_num_seqs,
    max_num_batched_tokens=budget,
    enable_prefix_caching=False,
    policy="priority",
  )
  return Scheduler(config, PageAllocator(num_pages, 2, False), 256)


def request(request_id: str, prompt, max_tokens: int, priority: int, arrival: float) -> Request:
  params = SamplingParams(max_tokens=max_tokens)
  return Request(request_id, list(prompt), params, 0, arrival_time=arrival, priority=priority)


def test_the_queue_orders_by_priority_then_arrival():
  queue = PriorityQueue()
  late_urgent = request("late-urgent", [1], 1, priority=-5, arrival=3.0)
  for r in (
    request("a", [1], 1, 0, 1.0),
    request("b", [1], 1, 1, 0.5),
    late_urgent,
    request("c", [1], 1, 0, 2.0),
  ):
    queue.add(r)
  assert [r.request_id for r in queue] == ["late-urgent", "a", "c", "b"]
  assert queue.pop() is late_urgent and queue.peek().request_id == "a"
  queue.add_preempted(late_urgent)  # back in its place, not at the front by default
  assert queue.peek() is late_urgent and len(queue) == 4
  fcfs = FcfsQueue()
  fcfs.add(request("x", [1], 1, 0, 1.0))
  fcfs.add_preempted(request("y", [1], 1, 0, 2.0))
  assert [r.request_id for r in fcfs] == ["y", "x"]  # fcfs: a preempted request goes first


def test_an_urgent_request_overtakes_the_waiting_ones():
  scheduler = make_scheduler(num_pages=64, max_num_seqs=1)
  for name, priority, arrival in (("a", 0, 1.0), ("b", 0, 2.0), ("urgent", -1, 3.0)):
    scheduler.add_request(request(name, [1, 2, 3], 2, priority, arrival))
  order = []
  while scheduler.has_unfinished_requests():
    batch = step(scheduler)
    order += [s.request_id for s in batch.seqs if s.request_id not in order]
  assert order == ["urgent", "a", "b"]


def test_the_least_urgent_running_request_is_preempted_first_and_the_most_urgent_last():
  # 8 pages of 2 tokens: three 3-token prompts take 2 pages each (the admission keeps a page
  # free for each first decode that starts a page); the 5th token needs a third page for each,
  # 2 are free, so the least urgent is preempted.
  scheduler = make_scheduler(num_pages=8, max_num_seqs=3)
  names = (("low", 5, 1.0), ("high", -5, 2.0), ("mid", 0, 3.0))
  requests = {n: request(n, [1, 2, 3], 4, p, t) for n, p, t in names}
  for r in requests.values():
    scheduler.add_request(r)
  first = step(scheduler)
  assert [s.request_id for s in first.seqs] == ["high", "mid", "low"]  # all three admitted
  assert step(scheduler).preempted_request_ids == ()  # the 4th token fits the 2nd page
  assert step(scheduler).preempted_request_ids == ("low",)  # the 5th needs a 3rd: 2 are free
  assert requests["high"].status is RequestStatus.RUNNING
  assert requests["high"].num_preemptions == 0
  while scheduler.has_unfinished_requests():
    step(scheduler)
    assert requests["high"].num_preemptions == 0  # never preempted while others run
  assert all(r.status is RequestStatus.FINISHED_LENGTH for r in requests.values())
  assert requests["low"].num_preemptions >= 1
  assert scheduler.allocator.num_used_pages == 0


def test_a_priority_needs_the_priority_policy():
  check_priority(0, "fcfs")
  check_priority(-3, "priority")
  with pytest.raises(ValueError, match=r"^priority: 2 needs priority scheduling"):
    check_priority(2, "fcfs")
  with pytest.raises(ValueError, match=r"^priority: must be an integer"):
    check_priority(1.5, "priority")
  with pytest.raises(ValueError, match=r"^scheduler.policy: must be one of"):
    SchedulerConfig(policy="lifo")
