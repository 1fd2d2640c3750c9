"""The step budget (engine/step_budget.py): the budget as a function of the decoding count D,
hand-computed for the serve default of a large GPU, and through the real scheduler on a small
config: a lone long prompt gets large chunks, many decoders bound the chunk, a prompt that does
not fill a wide rung stays at the latency budget.

The small config: 4 sequences, 64 tokens, latency budget 16. Its token ladder is (8, 16) dense
and (32, 64) wide; the streams allow a wide rung r while D x (r - D) <= 4 x (16 - 4) = 48: 64 at
D = 0, 32 at D = 1 (1 x 31), neither from D = 2 (2 x 30 = 60).
"""

from __future__ import annotations

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import SchedulerConfig
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.request import Request
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.step_budget import StepBudget, StepLimit, prompt_work
from tests.engine.test_scheduler import step

SERVE = SchedulerConfig(512, 8192, latency_batched_tokens=2048)  # a large GPU's serve default
SMALL = SchedulerConfig(4, 64, enable_prefix_caching=False, latency_batched_tokens=16)


def _request(request_id: str, num_prompt: int, max_tokens: int = 8) -> Request:
  prompt = [(7 * i + len(request_id)) % 100 for i in range(num_prompt)]
  return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens), seed=0)


def _scheduler(config: SchedulerConfig = SMALL) -> Scheduler:
  return Scheduler(config, PageAllocator(256, 4), 512)


def _chunks(batch) -> list[tuple[str, int, int]]:
  return [(s.request_id, s.start_position, s.num_tokens) for s in batch.seqs]


def test_the_budget_as_a_function_of_the_decoding_count():
  """S x (L - S) = 512 x 1,536 = 786,432: 8,192 while D x (8,192 - D) stays under it (D <= 97:
  97 x 8,095 = 785,215; 98 x 8,094 = 793,212), 4,096 while D x (4,096 - D) does (D <= 201:
  782,895; 202: 786,588), else the latency budget of 2,048."""
  budget = StepBudget.of(SERVE)
  assert budget.wide_rungs == (4096, 8192)
  largest = {d: budget.largest_allowed(d) for d in (0, 97, 98, 201, 202, 300, 512)}
  assert largest == {0: 8192, 97: 8192, 98: 4096, 201: 4096, 202: 2048, 300: 2048, 512: 2048}
  # the rung must be filled, by the decodes and the prompt tokens at hand
  assert budget.step_tokens(0, 8192) == 8192 and budget.step_tokens(0, 8191) == 4096
  assert budget.step_tokens(26, 4070) == 4096 and budget.step_tokens(26, 4069) == 2048
  assert budget.step_tokens(26, 1536) == 2048  # rate 16: one prompt stays in the dense ladder
  assert budget.step_tokens(300, 100_000) == 2048
  # every decode fits; the prompt tokens are what is left
  assert budget.limit(300, 100_000, False) == StepLimit(2048, 1748)
  assert budget.limit(50, 100_000, False) == StepLimit(8192, 8142)
  assert budget.limit(512, 0, False) == StepLimit(2048, 1536)  # a full batch's step
  # P (mixed_step_prefill_tokens) still caps the prompt tokens: max(P, B x (S - D) / S)
  capped = StepBudget.of(
    SchedulerConfig(512, 8192, latency_batched_tokens=2048, mixed_step_prefill_tokens=256)
  )
  assert capped.limit(256, 100_000, False) == StepLimit(2048, 1792)
  assert capped.limit(480, 100_000, False) == StepLimit(2048, 512)  # 8,192 x 32 / 512
  assert capped.limit(50, 100_000, False) == StepLimit(8192, 7392)  # 8,192 x 462 / 512


def test_a_fixed_budget_is_as_before():
  budget = StepBudget.of(SchedulerConfig(256, 2048))
  assert budget.wide_rungs == () and not budget.counts_decoding
  assert budget.limit(0, 0, False) == budget.limit(200, 0, False) == StepLimit(2048, 2048)
  capped = StepBudget.of(SchedulerConfig(4, 16, mixed_step_prefill_tokens=6))
  assert [capped.limit(d, 0, False).prompt_tokens for d in (0, 1, 2, 3)] == [16, 12, 8, 6]
  assert capped.limit(3, 0, True).prompt_tokens == 16  # a prefill-only step


def test_a_lone_long_prompt_gets_big_chunks():
  """100 prompt tokens, nothing decoding: 64 (it fills the largest rung), 32 (36 left fill 32,
  not 64), then 4 at the latency budget: 3 steps where a fixed budget of 16 takes 7."""
  scheduler = _scheduler()
  scheduler.add_request(_request("a", 100))
  assert [_chunks(step(scheduler)) for _ in range(3)] == [
    [("a", 0, 64)],
    [("a", 64, 32)],
    [("a", 96, 4)],
  ]
  fixed = _scheduler(SchedulerConfig(4, 16, enable_prefix_caching=False))
  fixed.add_request(_request("a", 100))
  assert [step(fixed).num_tokens for _ in range(7)] == [16] * 6 + [4]


def test_many_decoders_bound_the_chunk():
  """Three requests decode: a 100-token prompt gets 16 - 3 = 13 tokens a step (a fixed budget
  of 64 would give it 61); with one decoding it gets 32 - 1 = 31."""
  scheduler = _scheduler()
  for name in "bcd":
    scheduler.add_request(_request(name, 4, max_tokens=50))
  assert _chunks(step(scheduler)) == [("b", 0, 4), ("c", 0, 4), ("d", 0, 4)]  # 12: no rung
  scheduler.add_request(_request("e", 100))
  batch = step(scheduler)
  assert _chunks(batch) == [("b", 4, 1), ("c", 4, 1), ("d", 4, 1), ("e", 0, 13)]
  assert batch.num_tokens == 16 and _chunks(step(scheduler))[-1] == ("e", 13, 13)
  alone = _scheduler()
  alone.add_request(_request("b", 4, max_tokens=50))
  step(alone)
  alone.add_request(_request("e", 100))
  assert _chunks(step(alone)) == [("b", 4, 1), ("e", 0, 31)]


def test_a_prompt_that_does_not_fill_a_wide_rung_stays_at_the_latency_budget():
  """20 prompt tokens with nothing decoding: 16 then 4 (two dense steps), not one step of 20
  padded to the 32 rung."""
  scheduler = _scheduler()
  scheduler.add_request(_request("a", 20))
  assert [_chunks(step(scheduler)) for _ in range(2)] == [[("a", 0, 16)], [("a", 16, 4)]]


def test_prompt_work_counts_running_prompts_then_what_the_free_slots_admit():
  running = [_request("r", 30)]
  running[0].num_computed_tokens = 10  # 20 of its prompt left
  waiting = [_request("w1", 40), _request("w2", 50), _request("w3", 60)]
  assert prompt_work(running, waiting, free_slots=2, enough=10**6) == 20 + 40 + 50
  assert prompt_work(running, waiting, free_slots=3, enough=50) == 20 + 40  # counted until enough
  waiting[1].num_output_placeholders = 1  # preempted with a token in flight: admission waits
  assert prompt_work(running, waiting, free_slots=3, enough=10**6) == 20 + 40


def test_without_chunked_prefill_a_prompt_gets_a_rung_that_holds_it():
  """A 20-token prompt must fit one step: the 32 rung (padded) while the streams allow it; with
  two decoding (no wide rung allowed) it waits, and is admitted once they are done."""
  config = SchedulerConfig(
    4, 64, enable_chunked_prefill=False, enable_prefix_caching=False, latency_batched_tokens=16
  )
  assert StepBudget.of(config).step_tokens(0, 20, whole=20) == 32
  assert StepBudget.of(config).step_tokens(2, 20, whole=20) == 16
  scheduler = _scheduler(config)
  scheduler.add_request(_request("a", 20))
  assert _chunks(step(scheduler)) == [("a", 0, 20)]
  busy = _scheduler(config)
  for name in "bc":
    busy.add_request(_request(name, 4, max_tokens=3))
  step(busy)
  busy.add_request(_request("a", 20))
  assert [_chunks(step(busy)) for _ in range(3)] == [
    [("b", 4, 1), ("c", 4, 1)],
    [("b", 5, 1), ("c", 5, 1)],  # b and c end here (3 tokens each)
    [("a", 0, 20)],
  ]
