"""Iteration-level continuous batching (as in vLLM v1). Pure Python, no jax.

Each `schedule()` call plans one model step under a token budget (max_num_batched_tokens) and a
sequence limit (max_num_seqs), and returns a `ScheduledBatch`:

1. Running requests, in admission order. A decoding request gets 1 token; one still in (chunked)
   prefill gets min(remaining known tokens, budget left). Each gets pages for every position it
   will write. If the pool cannot supply them, the most recently admitted running request is
   preempted (recompute mode: its pages are freed, num_computed_tokens drops to 0 and it goes to
   the front of the waiting queue) and the allocation is retried; when the request being
   scheduled is itself the most recent, it is the one preempted and no further running request
   is scheduled this step.
2. If nothing was preempted, waiting requests are admitted first come, first served while the
   budget, max_num_seqs (a limit on running requests) and the pool allow. A request's known
   tokens are request.all_token_ids: the prompt, plus the tokens generated before a preemption.
   Without chunked prefill they must fit the step whole (a resumed request longer than a whole
   step is admitted alone into an otherwise empty step and then continues in chunks). Admission
   keeps one free page for each scheduled sequence whose next token starts a new page, so
   admitting a request does not force a preemption on the very next step.

Prefill first (config.prefill_first): step 1 skips decoding requests and preempts no one (a
prefill chunk whose pages are not free waits), and if that plans any work (prefill chunks or
admissions), the step is prefill only; otherwise a normal step runs. Normal steps keep the
progress argument below; a prefill-only step computes at least one token of finite prefill
work. Decodes then wait while prompts can be admitted (bounded by max_num_seqs and the pool),
which spends fewer steps on a batch of prompts: the decode rows of a mixed step cost their
attention and sampling, and do not shorten the decoding that follows the last prompt.

Decode bursts (num_scheduler_steps = K > 1): when no request waits for admission (or none could
be admitted: max_num_seqs are running) and every running request that still samples decodes
one token with sampling a burst can run (Request.can_burst: no penalties, top-N logprobs or
pending min_tokens), the step is a burst instead, unless every one of them has fewer than K
samples left (single steps then finish them without computing steps nobody needs): each of them
feeds its one token and the device runs K decode steps, each feeding the token the step before
sampled. Their pages cover the positions they still need (all K, or up to max_tokens),
num_computed_tokens advances by K and K output placeholders are counted; samples past max_tokens
or after a stop are dropped by the engine. A burst never preempts: if its pages do not fit, or a
request cannot burst, a normal step runs instead.

With prefix caching an admitted request first takes the cached full pages of its known tokens,
never covering the last one (a token must be computed for logits to exist), and none at all
when it asks for prompt_logprobs (those need the prompt's logits). Full pages are registered in
the cache as they are computed (at the next `schedule()`) and when a request finishes normally;
an admitted request's full pages are registered as soon as it is admitted, before the step that
computes them runs, so the requests admitted after it in the same step (the n choices of one
prompt, a burst of requests sharing a system prompt) take them as a hit instead of computing
them again. That is safe because every layer writes a step's K/V before any query of the step
reads the pages, and a step, once scheduled, always runs. The last, partial page is never
shared: each such request computes the tokens past the shared full pages (fewer than a page)
into a page of its own, so no page is written by two sequences and none needs copying. Each
admission that looked the cache up counts its known tokens as queried and the tokens its
cached pages cover as hits (`prefix_cache_queries`, `prefix_cache_hits`: vLLM's prefix cache
counters, in tokens); a look-up whose admission fails is not counted, the one that admits the
request is.

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
nothing; the engine discards it. Batch order: decodes (one-token queries that sample) first, then
prefill chunks, each group in scheduling order.
"""

from __future__ import annotations

import collections

from ..config import SchedulerConfig  # relative imports: this side never touches jax
from ..messages.kv_layout import KVLayout
from ..messages.scheduled_batch import ScheduledBatch
from .admission import check_length
from .batch_builder import BatchBuilder
from .kv_groups import KVGroupPages
from .page_allocator import PageAllocator, extend_page_hashes
from .request import Request, RequestStatus

_Planned = tuple[Request, int, int]  # (request, start position, tokens scheduled)


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
    self._prefix_caching = config.enable_prefix_caching
    self._waiting: collections.deque[Request] = collections.deque()
    self._running: list[Request] = []
    self._requests: dict[str, Request] = {}
    self._num_registered_pages: dict[str, int] = {}
    self._page_hashes: dict[str, list[bytes]] = {}  # request id -> chained hashes of its pages
    self._num_preemptions_total = 0
    self._prefix_cache_queries = 0
    self._prefix_cache_hits = 0

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
    return self._prefix_cache_queries

  @property
  def prefix_cache_hits(self) -> int:
    """Tokens of those admissions that cached pages covered."""
    return self._prefix_cache_hits

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
    self._waiting.append(request)

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
    if self._prefix_caching:
      self._register_computed_pages()
    if self.config.num_scheduler_steps > 1 and (
      not self._waiting or len(self._running) >= self.config.max_num_seqs
    ):
      burst = self._schedule_burst(self.config.num_scheduler_steps)
      if burst is not None:
        return burst
    if self.config.prefill_first:
      batch = self._plan(prefills_only=True)
      if batch is not None:
        return batch
    return self._plan(prefills_only=False)

  def _plan(self, prefills_only: bool) -> ScheduledBatch | None:
    """Step 1 and 2 of the module docstring; None if prefills_only and nothing was planned."""
    planned: list[_Planned] = []
    preempted_ids: list[str] = []
    budget = self._schedule_running(planned, preempted_ids, prefills_only)
    if not preempted_ids:
      self._admit_waiting(planned, budget)
    if prefills_only and not planned:
      return None
    return self._build_batch(planned, preempted_ids)

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
    check_length(num_prompt, request.sampling_params.max_tokens, self.max_model_len)
    total = request.max_total_tokens
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
    self, planned: list[_Planned], preempted_ids: list[str], prefills_only: bool = False
  ) -> int:
    budget, max_num_seqs, page_size = (
      self.config.max_num_batched_tokens,
      self.config.max_num_seqs,
      self.page_size,
    )
    index = 0
    while index < len(self._running) and budget > 0 and len(planned) < max_num_seqs:
      request = self._running[index]
      if self._windows:
        self._pages.release_outside_windows(request)
      start = request.num_computed_tokens
      num_known = request.num_tokens_with_placeholders
      num_new = min(num_known - start, budget) if num_known < request.max_total_tokens else 0
      decoding = start == num_known - 1 and start >= request.num_prompt_tokens
      if num_new > 0 and not (prefills_only and decoding):
        fits = start + num_new <= len(request.page_ids) * page_size  # most decode steps
        if not fits and prefills_only:  # a prefill-only step never preempts
          if not self.allocator.can_allocate(self._num_new_pages(request, num_new)):
            index += 1
            continue
          self._pages.allocate(request, start + num_new)
        elif not fits and not self._allocate_or_preempt(request, num_new, preempted_ids):
          break
        planned.append((request, start, num_new))
        budget -= num_new
      index += 1
    return budget

  def _schedule_burst(self, num_steps: int) -> ScheduledBatch | None:
    """Every running request that still samples decodes num_steps tokens in one dispatch; None
    (a normal step follows) unless each of them feeds exactly one token, may burst
    (Request.can_burst), the pages for the positions it still needs can be allocated without
    preempting anyone, and at least one of them still samples num_steps tokens or more. A
    request with fewer than num_steps samples left gets pages only for those: the device sends
    its later steps' K/V to the null page (or, past the block table, nowhere) and the engine
    drops what they sample, as it drops samples after a stop."""
    bursting = [r for r in self._running if r.num_tokens_with_placeholders < r.max_total_tokens]
    if not bursting or len(bursting) > min(
      self.config.max_num_seqs, self.config.max_num_batched_tokens
    ):
      return None
    if max(r.max_total_tokens - r.num_tokens_with_placeholders for r in bursting) < num_steps:
      return None  # every request ends within the burst: single steps compute no extra step
    for request in bursting:
      if (
        request.num_tokens_with_placeholders - request.num_computed_tokens != 1
        or not request.can_burst()
      ):
        return None
    if self._windows:
      for request in bursting:
        self._pages.release_outside_windows(request)
    num_new = [
      min(num_steps, request.max_total_tokens - request.num_tokens_with_placeholders)
      for request in bursting
    ]
    num_needed = [self._num_new_pages(r, n) for r, n in zip(bursting, num_new)]
    if not self.allocator.can_allocate(sum(num_needed)):
      return None
    decodes = []
    for request, n, num_pages in zip(bursting, num_new, num_needed):
      if num_pages:
        self._pages.allocate(request, request.num_computed_tokens + n)
      decodes.append((request, request.num_computed_tokens))
      request.num_computed_tokens += num_steps
      request.num_output_placeholders += num_steps
    builder = BatchBuilder(self._pages.num_groups)
    builder.add_decodes(decodes)
    return builder.build([], num_steps)

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
    self._release_pages(request)
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    request.status = RequestStatus.WAITING
    self._waiting.appendleft(request)
    self._num_preemptions_total += 1

  def _admit_waiting(self, planned: list[_Planned], budget: int) -> None:
    if not self._waiting:
      return
    reserve = sum(self._needs_pages_next_step(r, start + n) for r, start, n in planned)
    while (
      self._waiting
      and budget > 0
      and len(self._running) < self.config.max_num_seqs
      and len(planned) < self.config.max_num_seqs
    ):
      request = self._waiting[0]
      if request.num_output_placeholders:  # preempted with a token in flight: wait for it
        break
      num_new = self._try_admit(request, budget, reserve)
      if num_new == 0:
        break
      self._waiting.popleft()
      request.status = RequestStatus.RUNNING
      self._running.append(request)
      start = request.num_computed_tokens
      planned.append((request, start, num_new))
      budget -= num_new
      if self._prefix_caching:  # the requests admitted after it this step share its pages
        self._register_pages(request, start + num_new)
      reserve += self._needs_pages_next_step(request, start + num_new)

  def _try_admit(self, request: Request, budget: int, reserve: int) -> int:
    """Takes cached pages and allocates the first chunk; 0 (and nothing held) if it can't."""
    looked_up = self._take_cached_prefix(request)
    num_new = self._admission_chunk(request.num_tokens - request.num_computed_tokens, budget)
    if num_new > 0:
      num_needed = self._num_new_pages(request, num_new)
      if self.allocator.can_allocate(num_needed + reserve):
        self._pages.allocate(request, request.num_computed_tokens + num_new)
        if looked_up:
          self._prefix_cache_queries += request.num_tokens
          self._prefix_cache_hits += request.num_computed_tokens
        return num_new
    self._release_pages(request)
    request.num_computed_tokens = 0
    return 0

  def _take_cached_prefix(self, request: Request) -> bool:
    """Takes the request's cached full pages; False if it may not read the cache."""
    if not self._prefix_caching or request.sampling_params.prompt_logprobs is not None:
      return False
    hashes = self._hashes(request, (request.num_tokens - 1) // self.page_size)
    num_hit = self._pages.take_cached_prefix(request, hashes)
    request.num_computed_tokens = num_hit * self.page_size
    self._num_registered_pages[request.request_id] = num_hit
    return True

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

  def _num_new_pages(self, request: Request, num_new: int) -> int:
    return self._pages.num_new_pages(request, request.num_computed_tokens + num_new)

  def _hashes(self, request: Request, num_pages: int) -> list[bytes]:
    """The chained hashes of the request's first num_pages pages (kept, extended as needed)."""
    hashes = self._page_hashes.setdefault(request.request_id, [])
    if len(hashes) < num_pages:
      num_tokens = num_pages * self.page_size
      extend_page_hashes(hashes, request.all_token_ids[:num_tokens], self.page_size)
    return hashes[:num_pages]

  def _register_computed_pages(self) -> None:
    """Registers the full pages the last step computed. A running request can have a newly
    filled page only once its computed tokens reach the end of the page after its registered
    ones; the others cost one comparison."""
    registered, page_size = self._num_registered_pages, self.page_size
    for request in self._running:
      if request.num_computed_tokens >= (registered.get(request.request_id, 0) + 1) * page_size:
        self._register_pages(request)

  def _register_pages(self, request: Request, end: int | None = None) -> None:
    """Registers the request's full pages below `end` (default: its computed tokens)."""
    computed = request.num_computed_tokens if end is None else end
    num_written = min(
      computed, request.num_tokens, len(request.page_ids) * self.page_size
    )  # a burst may run past its pages
    num_full = num_written // self.page_size
    first = self._num_registered_pages.get(request.request_id, 0)
    if num_full <= first:
      return
    self._pages.register(request, self._hashes(request, num_full), first)
    self._num_registered_pages[request.request_id] = num_full

  def _release_pages(self, request: Request) -> None:
    self._pages.release(request)
    self._num_registered_pages.pop(request.request_id, None)

  def _remove(self, request: Request, status: RequestStatus) -> None:
    if request.status is RequestStatus.RUNNING:
      self._running.remove(request)
      if self._prefix_caching and status in (
        RequestStatus.FINISHED_STOPPED,
        RequestStatus.FINISHED_LENGTH,
      ):
        self._register_pages(request)
    else:
      self._waiting.remove(request)
    self._release_pages(request)
    self._page_hashes.pop(request.request_id, None)
    request.status = status
    del self._requests[request.request_id]

  def _build_batch(self, planned: list[_Planned], preempted_ids: list[str]) -> ScheduledBatch:
    decodes: list[tuple[Request, int]] = []
    prefills: list[tuple[Request, int, int, bool]] = []
    for request, start, num_new in planned:
      end = start + num_new
      request.num_computed_tokens = end
      sample = end == request.num_tokens_with_placeholders
      request.num_output_placeholders += sample
      if num_new == 1 and sample:
        decodes.append((request, start))
      else:
        prefills.append((request, start, num_new, sample))
    columns = BatchBuilder(self._pages.num_groups)
    columns.add_decodes(decodes)
    for request, start, num_new, sample in prefills:
      columns.add_prefill(request, start, num_new, sample)
    return columns.build(preempted_ids)
