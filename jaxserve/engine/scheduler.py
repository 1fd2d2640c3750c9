"""Iteration-level continuous batching (as in vLLM v1). Pure Python, no jax.

Each `schedule()` call plans one model step under a token budget (max_num_batched_tokens) and a
sequence limit (max_num_seqs), and returns a `ScheduledBatch`:

1. Running requests, in the policy's order (engine/request_queue.py: admission order, or priority
   then arrival). A decoding request gets 1 token; one still in (chunked)
   prefill gets min(remaining known tokens, budget left). Each gets pages for every position it
   will write. If the pool cannot supply them, the most recently admitted running request is
   preempted (recompute mode: its pages are freed, num_computed_tokens drops to 0 and it goes to
   the front of the waiting queue) and the allocation is retried; when the request being
   scheduled is itself the most recent, it is the one preempted and no further running request
   is scheduled this step.
2. If nothing was preempted, waiting requests are admitted in the policy's order while the
   budget, max_num_seqs and the pool allow, keeping a free page for each scheduled sequence
   whose next token starts a new page (engine/waiting_admission.py states the rules).

Prefill first (config.prefill_first): step 1 skips decoding requests and preempts no one (a
prefill chunk whose pages are not free waits), and if that plans any work (prefill chunks or
admissions), the step is prefill only; otherwise a normal step runs. Normal steps keep the
progress argument below; a prefill-only step computes at least one token of finite prefill
work. Decodes then wait while prompts can be admitted (bounded by max_num_seqs and the pool),
which spends fewer steps on a batch of prompts: the decode rows of a mixed step cost their
attention and sampling, and do not shorten the decoding that follows the last prompt.

The step budget (engine/step_budget.py states the rule): each step's token budget and its
prompt tokens at most, from the number of running requests that decode and the prompt work at
hand: max_num_batched_tokens for a fixed budget (fewer prompt tokens while requests decode with
config.mixed_step_prefill_tokens), or with config.latency_batched_tokens a budget that follows
the load. Every decode fits it, and the first prefill chunk planned still gets at least one
token, so the progress argument holds.

Decode bursts (num_scheduler_steps = K > 1): when no request waits for admission (or none could
be admitted: max_num_seqs are running), the step is first offered to engine/decode_burst.py,
which plans K decode steps in one dispatch when every running request that still samples can
burst and its pages fit without preempting; otherwise the steps above run.

Prefix caching (engine/prefix_cache_pages.py): an admitted request takes the cached full pages
of its known tokens; full pages are registered as they are computed (at the next `schedule()`),
when a request is admitted, and when it finishes normally (FINISHED_STOPPED, FINISHED_LENGTH).

KV groups (messages/kv_layout.py; engine/kv_groups.py does the page work): a model with
sliding-window layers has a block table per group. Before a running request is scheduled, its
sliding pages wholly before its next query's window are released; a step's pages are
allocated in every group (a sliding group's from the first query's window on); allocation,
preemption, the admission reserve (a page per group) and the prefix cache count every group;
a hit is the longest prefix every group can serve.

Progress: add_request refuses requests the pool could never hold alone (`KVLayout.max_pages`:
every page of group 0, a chunk's and a window's in a sliding group), so the oldest running
request always gets its pages (it is never the preemption victim while others run, and alone
it fits) and at least one token of budget; every step advances it, so no livelock.

`schedule()` assumes the step it returns runs before the next call: it advances each scheduled
request's num_computed_tokens. A sequence samples when it reaches all its known tokens; the
scheduler then counts one output placeholder for it, and the engine, once it has the step's
result, replaces the placeholder by the sampled token (request.output_token_ids) or finishes the
request. With async scheduling the engine calls `schedule()` for step N+1 while step N still
runs: a decoding request whose token from step N is a placeholder is scheduled to feed it
(PLACEHOLDER_TOKEN_ID in the batch, batch_builder.py; the device takes the real id from step N's
output), and one whose placeholder is its last token (max_tokens reached) is not scheduled
again. A request that turns out to have stopped at step N has then computed one token for
nothing; the engine discards it. Batch order (engine/step_plan.py): decodes (one-token queries
that sample) first, then prefill chunks, each group in scheduling order.
"""

from __future__ import annotations

from ..config import SchedulerConfig  # relative imports: this side never touches jax
from ..messages.kv_layout import KVLayout
from ..messages.scheduled_batch import ScheduledBatch
from .admission import check_length
from .decode_burst import schedule_burst
from .kv_groups import KVGroupPages
from .page_allocator import PageAllocator
from .prefix_cache_pages import PrefixCachePages
from .request import Request, RequestStatus
from .request_queue import RequestQueue, request_queue
from .step_budget import StepBudget, StepLimit, is_decoding, prompt_work
from .step_plan import PlannedChunk, build_step_batch
from .waiting_admission import WaitingAdmission


class Scheduler:
  """Owns the waiting and running queues; see the module docstring."""

  def __init__(
    self,
    config: SchedulerConfig,
    allocator: PageAllocator,
    max_model_len: int,
    layout: KVLayout | None = None,
  ) -> None:
    """layout: the model's KV groups (None: one group, nothing freed)."""
    if not isinstance(max_model_len, int) or max_model_len < 1:
      raise ValueError(f"max_model_len: must be a positive integer, got {max_model_len!r}")
    if config.enable_prefix_caching and not allocator.enable_prefix_caching:
      raise ValueError(
        "scheduler.enable_prefix_caching: set, but the page allocator was built "
        "without prefix caching"
      )
    layout = layout or KVLayout.single(allocator.page_size, 1)
    if layout.page_size != allocator.page_size:
      raise ValueError(
        f"layout: pages of {layout.page_size} tokens, the allocator's of {allocator.page_size}"
      )
    self.config = config
    self.allocator = allocator
    self.layout = layout
    self.max_model_len = max_model_len
    self.page_size = allocator.page_size
    self._pages = KVGroupPages(allocator, layout.windows)
    self._windows = bool(layout.windows)
    self._prefix_cache = PrefixCachePages(self._pages, config.enable_prefix_caching)
    self._admission = WaitingAdmission(config, self._pages, self._prefix_cache)
    self._budget = StepBudget.of(config)
    self._waiting: RequestQueue = request_queue(config.policy)
    self._running: list[Request] = []
    self._requests: dict[str, Request] = {}
    self._num_preemptions_total = 0

  @property
  def num_running(self) -> int:
    return len(self._running)

  @property
  def num_waiting(self) -> int:
    return len(self._waiting)

  @property
  def num_preemptions_total(self) -> int:
    return self._num_preemptions_total

  @property
  def prefix_cache_queries(self) -> int:
    """Known tokens of the admissions that looked the prefix cache up."""
    return self._prefix_cache.queries

  @property
  def prefix_cache_hits(self) -> int:
    """Tokens of those admissions that cached pages covered."""
    return self._prefix_cache.hits

  @property
  def kv_cache_usage(self) -> float:
    """Fraction of usable pages held by sequences (evictable cached pages count as free)."""
    return self.allocator.num_used_pages / self.allocator.num_usable_pages

  def has_unfinished_requests(self) -> bool:
    return bool(self._waiting or self._running)

  def get_request(self, request_id: str) -> Request | None:
    """The waiting or running request with this id; None once finished or if unknown."""
    return self._requests.get(request_id)

  def add_request(self, request: Request) -> None:
    self._validate(request)
    self._pages.clear(request)
    request.status = RequestStatus.WAITING
    self._requests[request.request_id] = request
    self._waiting.add(request)

  def finish_request(self, request_id: str, status: RequestStatus) -> None:
    """Removes a waiting or running request and frees its pages.

    Full pages are registered in the prefix cache first, except for FINISHED_ERROR and
    FINISHED_ABORTED, whose last step may not have produced valid K/V.
    """
    if not status.finished:
      raise ValueError(f"status: {status} is not a finished status")
    request = self._requests.get(request_id)
    if request is None:
      raise ValueError(f"request_id: unknown or finished request {request_id!r}")
    self._remove(request, status)

  def abort_request(self, request_id: str) -> bool:
    """Aborts a waiting or running request; False if the id is unknown or already finished."""
    request = self._requests.get(request_id)
    if request is None:
      return False
    self._remove(request, RequestStatus.FINISHED_ABORTED)
    return True

  def schedule(self) -> ScheduledBatch:
    self._prefix_cache.register_computed(self._running)
    if self.config.num_scheduler_steps > 1 and (
      not self._waiting or len(self._running) >= self.config.max_num_seqs
    ):
      burst = schedule_burst(self._running, self.config, self._pages)
      if burst is not None:
        return burst
    if self.config.prefill_first:
      batch = self._plan(prefills_only=True)
      if batch is not None:
        return batch
    return self._plan(prefills_only=False)

  def _plan(self, prefills_only: bool) -> ScheduledBatch | None:
    """Step 1 and 2 of the module docstring; None if prefills_only and nothing was planned."""
    planned: list[PlannedChunk] = []
    preempted_ids: list[str] = []
    budget, prefill_budget = self._schedule_running(
      planned, preempted_ids, self._step_limit(prefills_only), prefills_only
    )
    if not preempted_ids:
      self._admission.admit(self._waiting, self._running, planned, min(budget, prefill_budget))
    if prefills_only and not planned:
      return None
    return build_step_batch(planned, preempted_ids, self._pages.num_groups)

  def _step_limit(self, prefills_only: bool) -> StepLimit:
    """This step's token budget and prompt tokens at most (engine/step_budget.py)."""
    budget = self._budget
    counted = budget.counts_decoding and not prefills_only
    decoding = sum(map(is_decoding, self._running)) if counted else 0
    largest = budget.largest_allowed(decoding)
    work = whole = 0
    if largest > budget.latency_tokens:  # a wide rung is allowed: is there the work?
      free_slots = self.config.max_num_seqs - len(self._running)
      work = prompt_work(self._running, self._waiting, free_slots, largest - decoding)
      if not self.config.enable_chunked_prefill and self._waiting and free_slots > 0:
        whole = self._waiting.peek().num_tokens  # admitted whole, or not at all
    return budget.limit(decoding, work, prefills_only, whole)

  def _validate(self, request: Request) -> None:
    request_id, num_prompt = request.request_id, request.num_prompt_tokens
    if request_id in self._requests:
      raise ValueError(f"request_id: {request_id!r} is already waiting or running")
    if num_prompt == 0:
      raise ValueError(f"prompt: request {request_id!r} has no tokens")
    if (
      request.page_ids
      or any(request.window_page_ids)
      or request.num_computed_tokens
      or request.num_output_placeholders
    ):
      raise ValueError(f"page_ids: request {request_id!r} already holds pages or computed tokens")
    self.check_servable(num_prompt, request.sampling_params.max_tokens)

  def check_servable(self, num_prompt: int, max_tokens: int) -> None:
    """A ValueError naming the field if a request of this prompt and max_tokens could never be
    served, whatever else runs: past max_model_len, more pages than the pool holds, or a prompt
    over the step's budget without chunked prefill."""
    check_length(num_prompt, max_tokens, self.max_model_len)
    total = num_prompt + max_tokens
    chunk = max(self.config.max_num_batched_tokens, self.config.num_scheduler_steps)
    num_pages = self.layout.max_pages(total, chunk)
    if num_pages > self.allocator.num_usable_pages:
      groups = f" in its {self.layout.num_groups} KV groups" if self._windows else ""
      raise ValueError(
        f"max_tokens: prompt + max_tokens ({total} tokens) needs {num_pages} "
        f"KV cache pages{groups} but the pool has {self.allocator.num_usable_pages}"
      )
    budget = self.config.max_num_batched_tokens
    if not self.config.enable_chunked_prefill and num_prompt > budget:
      raise ValueError(
        f"prompt: {num_prompt} tokens exceed scheduler.max_num_batched_tokens "
        f"({budget}) with chunked prefill disabled"
      )

  def _schedule_running(
    self,
    planned: list[PlannedChunk],
    preempted_ids: list[str],
    limit: StepLimit,
    prefills_only: bool = False,
  ) -> tuple[int, int]:
    """Step 1: the running requests' chunks; returns the token and prompt-token budgets left."""
    budget, prefill_budget = limit.tokens, limit.prompt_tokens
    max_num_seqs, page_size = self.config.max_num_seqs, self.page_size
    index = 0
    while index < len(self._running) and budget > 0 and len(planned) < max_num_seqs:
      request = self._running[index]
      if self._windows:
        self._pages.release_outside_windows(request)
      start = request.num_computed_tokens
      num_known = request.num_tokens_with_placeholders
      decoding = is_decoding(request)
      room = budget if decoding else min(budget, prefill_budget)
      num_new = min(num_known - start, room) if num_known < request.max_total_tokens else 0
      if num_new > 0 and not (prefills_only and decoding):
        fits = start + num_new <= len(request.page_ids) * page_size  # most decode steps
        if not fits and prefills_only:  # a prefill-only step never preempts
          if not self.allocator.can_allocate(self._num_new_pages(request, num_new)):
            index += 1
            continue
          self._pages.allocate(request, start + num_new)
        elif not fits and not self._allocate_or_preempt(request, num_new, preempted_ids):
          break
        planned.append(PlannedChunk(request, start, num_new))
        budget -= num_new
        prefill_budget -= 0 if decoding else num_new
      index += 1
    return budget, prefill_budget

  def _allocate_or_preempt(self, request: Request, num_new: int, preempted_ids: list[str]) -> bool:
    num_needed = self._num_new_pages(request, num_new)
    if num_needed == 0:  # most decode steps stay inside the last page
      return True
    while not self.allocator.can_allocate(num_needed):
      victim = self._running[-1]
      self._preempt(victim)
      preempted_ids.append(victim.request_id)
      if victim is request:
        return False
    self._pages.allocate(request, request.num_computed_tokens + num_new)
    return True

  def _preempt(self, request: Request) -> None:
    self._running.remove(request)
    self._prefix_cache.release(request)
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    request.status = RequestStatus.WAITING
    self._waiting.add_preempted(request)
    self._num_preemptions_total += 1

  def _num_new_pages(self, request: Request, num_new: int) -> int:
    return self._pages.num_new_pages(request, request.num_computed_tokens + num_new)

  def _remove(self, request: Request, status: RequestStatus) -> None:
    if request.status is RequestStatus.RUNNING:
      self._running.remove(request)
      if status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH):
        self._prefix_cache.register(request)
    else:
      self._waiting.remove(request)
    self._prefix_cache.release(request)
    self._prefix_cache.forget(request)
    request.status = status
    del self._requests[request.request_id]
