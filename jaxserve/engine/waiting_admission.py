"""Step 2 of a scheduler step (engine/scheduler.py): admitting waiting requests into the step
after the running ones were planned. Pure Python, no jax.

Waiting requests are admitted first come, first served while the budget, max_num_seqs (a limit
on running requests) and the pool allow. A request's known tokens are request.all_token_ids:
the prompt, plus the tokens generated before a preemption. Without chunked prefill they must
fit the step whole (a resumed request longer than a whole step is admitted alone into an
otherwise empty step and then continues in chunks). Admission keeps one free page for each
scheduled sequence whose next token starts a new page (one per KV group), so admitting a
request does not force a preemption on the very next step. A request at the head of the queue
that was preempted with a token still in flight (an output placeholder) waits for it, and so
does everything behind it.

With prefix caching an admitted request first takes its cached full pages
(engine/prefix_cache_pages.py); its look-up is counted only if the request is admitted, and its
full pages are registered as soon as it is, so the requests admitted after it in the same step
share them.

Contracts. `WaitingAdmission.admit` is called only when the step preempted no one; it moves the
admitted requests from the head of the waiting queue to the tail of the running queue, sets
them RUNNING and appends a `PlannedChunk` (engine/step_plan.py) for each (start: the request's
num_computed_tokens, its cached prefix; num_new: its first chunk), with its pages allocated; the
caller advances num_computed_tokens when it builds the batch. A request that cannot be admitted
holds no page and has num_computed_tokens 0.
"""

from __future__ import annotations

from ..config import SchedulerConfig  # relative imports: this side never touches jax
from .kv_groups import KVGroupPages
from .prefix_cache_pages import PrefixCachePages
from .request import Request, RequestStatus
from .request_queue import RequestQueue
from .step_plan import PlannedChunk


class WaitingAdmission:
  """The admission of waiting requests (module docstring), over the scheduler's pages."""

  def __init__(
    self, config: SchedulerConfig, pages: KVGroupPages, prefix_cache: PrefixCachePages
  ) -> None:
    self.config = config
    self.page_size = pages.page_size
    self._pages = pages
    self._prefix_cache = prefix_cache

  def admit(
    self,
    waiting: RequestQueue,
    running: list[Request],
    planned: list[PlannedChunk],
    budget: int,
  ) -> None:
    """Admits from the head of `waiting` into `running` and `planned` within `budget` tokens."""
    if not waiting:
      return
    max_num_seqs = self.config.max_num_seqs
    reserve = sum(self._needs_pages_next_step(r, start + n) for r, start, n in planned)
    while waiting and budget > 0 and len(running) < max_num_seqs and len(planned) < max_num_seqs:
      request = waiting.peek()
      if request.num_output_placeholders:  # preempted with a token in flight: wait for it
        break
      num_new = self._try_admit(request, budget, reserve)
      if num_new == 0:
        break
      waiting.pop()
      request.status = RequestStatus.RUNNING
      waiting.insert_running(running, request)
      start = request.num_computed_tokens
      planned.append(PlannedChunk(request, start, num_new))
      budget -= num_new
      # the requests admitted after it this step share its pages
      self._prefix_cache.register(request, start + num_new)
      reserve += self._needs_pages_next_step(request, start + num_new)

  def _try_admit(self, request: Request, budget: int, reserve: int) -> int:
    """Takes cached pages and allocates the first chunk; 0 (and nothing held) if it can't."""
    looked_up = self._prefix_cache.take_cached_prefix(request)
    num_new = self._admission_chunk(request.num_tokens - request.num_computed_tokens, budget)
    if num_new > 0:
      end = request.num_computed_tokens + num_new
      if self._pages.allocator.can_allocate(self._pages.num_new_pages(request, end) + reserve):
        self._pages.allocate(request, end)
        if looked_up:
          self._prefix_cache.count_lookup(request)
        return num_new
    self._prefix_cache.release(request)
    request.num_computed_tokens = 0
    return 0

  def _admission_chunk(self, num_remaining: int, budget: int) -> int:
    if self.config.enable_chunked_prefill or num_remaining <= budget:
      return min(num_remaining, budget)
    step_budget = self.config.max_num_batched_tokens
    if num_remaining > step_budget and budget == step_budget:
      return budget  # a resumed request longer than any step: recompute it in chunks
    return 0

  def _needs_pages_next_step(self, request: Request, seq_len: int) -> int:
    """The pages (one per KV group) the token sampled at seq_len needs if it will be fed next
    step and start a new page; else 0."""
    num_known = request.num_tokens_with_placeholders
    samples = seq_len == num_known
    continues = num_known + 1 < request.max_total_tokens
    starts_page = seq_len == len(request.page_ids) * self.page_size
    return self._pages.num_groups if samples and continues and starts_page else 0
