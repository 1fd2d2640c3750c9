"""Scheduler + PageAllocator under random add / step / finish / abort sequences (hypothesis).

A simulated engine runs each step: it writes every fed token's "K/V" (the token prefix it
depends on) into a dictionary keyed by (page, offset), then reads back every scheduled
sequence's whole context through its block table. Prefix sharing, preemption or page reuse that
served a sequence the wrong K/V would show up as a mismatch. Pools are tiny to force preemption.
In async mode the engine is simulated one step behind, as with async scheduling: the tokens a
step samples reach the requests only after the next step has been scheduled, so that step feeds
placeholders (the simulated device knows their values). With num_scheduler_steps > 1 a burst
runs several decode steps, each feeding the token the one before sampled, and the engine drops
the samples past max_tokens.

KV groups (messages/kv_layout.py): with sliding windows, each sequence has a block table per
group; the simulated device writes every group's K/V (tagged with the group) and reads a sliding
group's only from the first position the step's first query sees (start - window + 1), so a page
released from a window and handed to another sequence or group, or a wrong prefix hit in a
group, shows as a mismatch. The invariants also check that the pages a request holds in a
sliding group never exceed what its window and a step's chunk need.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import SchedulerConfig
from jaxserve.engine.batch_builder import PLACEHOLDER_TOKEN_ID
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.step_budget import StepBudget
from jaxserve.messages.kv_layout import KVGroupSpec, KVLayout
from jaxserve.messages.scheduled_batch import ScheduledBatch


def _ceil_div(a: int, b: int) -> int:
  return -(-a // b)


def _first_seen_page(start: int, window: int, page_size: int) -> int:
  """The first page a query at `start` with this window reads."""
  return max(0, start - window + 1) // page_size


def _next_token(tokens: list[int]) -> int:
  """Deterministic in the prefix, so requests with equal prompts generate equal tokens."""
  return (tokens[-1] + len(tokens)) % 3


class SchedulerMachine(RuleBasedStateMachine):
  @initialize(
    page_size=st.sampled_from([1, 2, 4]),
    num_pages=st.integers(2, 16),
    max_num_seqs=st.integers(1, 4),
    extra_budget=st.integers(0, 10),
    chunked=st.booleans(),
    prefix_caching=st.booleans(),
    max_model_len=st.integers(2, 48),
    async_mode=st.booleans(),
    burst_steps=st.sampled_from([1, 1, 2, 3]),
    prefill_first=st.booleans(),
    mixed_cap=st.sampled_from([None, None, 1, 2, 3]),
    latency_room=st.sampled_from([None, None, 0, 1, 3]),
    windows=st.sampled_from([(), (), (1,), (3,), (5,), (2, 2), (3, 6)]),
  )
  def setup(
    self,
    page_size,
    num_pages,
    max_num_seqs,
    extra_budget,
    chunked,
    prefix_caching,
    max_model_len,
    async_mode,
    burst_steps,
    prefill_first,
    mixed_cap,
    latency_room,
    windows,
  ):
    budget = max_num_seqs + extra_budget
    self.config = SchedulerConfig(
      max_num_seqs=max_num_seqs,
      max_num_batched_tokens=budget,
      enable_chunked_prefill=chunked,
      enable_prefix_caching=prefix_caching,
      num_scheduler_steps=burst_steps,
      prefill_first=prefill_first,
      mixed_step_prefill_tokens=None if mixed_cap is None else min(mixed_cap, budget),
      latency_batched_tokens=None
      if latency_room is None
      else min(max_num_seqs + latency_room, budget),
    )
    self.step_budget = StepBudget.of(self.config)
    self.allocator = PageAllocator(num_pages, page_size, prefix_caching)
    groups = (KVGroupSpec(None, (0,)),) + tuple(
      KVGroupSpec(window, (g,)) for g, window in enumerate(windows, 1)
    )
    layout = KVLayout(page_size, groups)
    self.scheduler = Scheduler(self.config, self.allocator, max_model_len, layout)
    self.windows = windows
    self.chunk = max(self.config.max_num_batched_tokens, burst_steps)
    self.page_size = page_size
    self.max_model_len = max_model_len
    self.requests: dict[str, Request] = {}
    self.kv: dict[tuple[int, int], tuple[int, ...]] = {}
    self.num_added = 0
    self.async_mode = async_mode
    self.in_flight: dict[str, list[int]] = {}  # request id -> sampled, not yet delivered

  @rule(
    shared=st.integers(0, 6),
    tail=st.lists(st.integers(0, 2), max_size=6),
    max_tokens=st.integers(1, 6),
    prompt_logprobs=st.sampled_from([None, None, 0]),
  )
  def add(self, shared, tail, max_tokens, prompt_logprobs):
    prompt = [7] * shared + tail
    request_id = f"r{self.num_added}"
    self.num_added += 1
    params = SamplingParams(max_tokens=max_tokens, prompt_logprobs=prompt_logprobs)
    request = Request(request_id, prompt, params, seed=0)
    total = len(prompt) + max_tokens
    full = _ceil_div(total, self.page_size)
    most = full + sum(min(full, self._window_bound(w)) for w in self.windows)
    accepted = (
      len(prompt) > 0
      and total <= self.max_model_len
      and most <= self.allocator.num_usable_pages
      and (self.config.enable_chunked_prefill or len(prompt) <= self.config.max_num_batched_tokens)
    )
    if not accepted:
      with pytest.raises(ValueError):
        self.scheduler.add_request(request)
      return
    self.scheduler.add_request(request)
    self.requests[request_id] = request
    if len(self.requests) >= 3:
      event("3+ requests accepted")

  @rule()
  def step(self):
    waiting_ids = {r.request_id for r in self._with_status(RequestStatus.WAITING)}
    batch = self.scheduler.schedule()
    self._check_batch(batch)
    self._check_mixed_step(batch, waiting_ids)
    self._record_events(batch, waiting_ids)
    sampled = self._simulate_kv(batch, waiting_ids)
    if batch.num_steps > 1:
      event("decode burst")
    if self.async_mode:
      self._deliver(self.in_flight)
      self.in_flight = sampled
    else:
      self._deliver(sampled)

  def _device_tokens(self, request: Request) -> list[int]:
    """What the device has: the known tokens plus those sampled by the step in flight."""
    return request.all_token_ids + self.in_flight.get(request.request_id, [])

  def _deliver(self, sampled: dict[str, list[int]]) -> None:
    for request_id, token_ids in sampled.items():
      request = self.requests[request_id]
      for token_id in token_ids:
        if request.finished:  # aborted, stopped or at max_tokens: later samples are dropped
          break
        request.append_sampled(token_id)
        if len(request.output_token_ids) >= request.sampling_params.max_tokens:
          self.scheduler.finish_request(request_id, RequestStatus.FINISHED_LENGTH)

  @rule(index=st.integers(0, 1000))
  def finish_stopped(self, index):
    running = self._with_status(RequestStatus.RUNNING)
    if running:
      request = running[index % len(running)]
      self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
      assert request.status is RequestStatus.FINISHED_STOPPED

  @rule(index=st.integers(0, 1000))
  def abort(self, index):
    ids = list(self.requests) + ["unknown"]
    request_id = ids[index % len(ids)]
    request = self.requests.get(request_id)
    was_unfinished = request is not None and not request.finished
    assert self.scheduler.abort_request(request_id) == was_unfinished
    if was_unfinished:
      assert request.status is RequestStatus.FINISHED_ABORTED and request.page_ids == []

  def _window_bound(self, window: int) -> int:
    """The most pages a sliding group may hold: a chunk's and the window's before it."""
    return _ceil_div(window - 1 + self.chunk, self.page_size) + 1

  @invariant()
  def pages_are_accounted_for(self):
    running = self._with_status(RequestStatus.RUNNING)
    waiting = self._with_status(RequestStatus.WAITING)
    window_owners = [[r.window_page_ids[k] for r in running] for k in range(len(self.windows))]
    self.allocator.check_invariants([r.page_ids for r in running], window_owners)
    owned = {p for r in running for t in [r.page_ids, *r.window_page_ids] for p in t} - {0}
    assert self.allocator.num_used_pages == len(owned) <= self.allocator.num_usable_pages
    for request in running:
      self._check_window_tables(request)
    assert (
      self.allocator.num_used_pages + self.allocator.num_free_pages
      == self.allocator.num_usable_pages
    )
    assert self.scheduler.num_running == len(running) <= self.config.max_num_seqs
    assert self.scheduler.num_waiting == len(waiting)
    for request in running:
      paged_end = min(request.num_computed_tokens, request.max_total_tokens - 1)
      assert len(request.page_ids) == _ceil_div(paged_end, self.page_size)
    for request in waiting:
      assert request.page_ids == [] and request.num_computed_tokens == 0
      assert request.window_page_ids == [[] for _ in self.windows]
    if not self.scheduler.has_unfinished_requests():
      assert self.allocator.num_used_pages == 0

  def teardown(self):
    if not hasattr(self, "scheduler"):
      return
    unfinished = [r for r in self.requests.values() if not r.finished]
    # Every step advances the oldest running request, which is never preempted.
    max_steps = sum(r.max_total_tokens for r in unfinished) + 2
    for _ in range(max_steps):
      if not self.scheduler.has_unfinished_requests() and not self.in_flight:
        break
      self.step()
      self.pages_are_accounted_for()
    assert not self.scheduler.has_unfinished_requests(), "scheduler made no progress"
    assert all(r.finished for r in self.requests.values())
    assert self.allocator.num_used_pages == 0

  def _check_window_tables(self, request: Request) -> None:
    """Each sliding table is as long as group 0's, null exactly below some page at or below the
    first one the next query reads, and holds at most the window bound."""
    for window, table in zip(self.windows, request.window_page_ids, strict=True):
      assert len(table) == len(request.page_ids)
      num_null = table.count(0)
      assert table[:num_null] == [0] * num_null and 0 not in table[num_null:]
      next_start = min(request.num_computed_tokens, len(table) * self.page_size)
      assert num_null <= _first_seen_page(next_start, window, self.page_size)
      assert len(table) - num_null <= self._window_bound(window)
      if num_null:
        event("window pages released")

  def _with_status(self, status: RequestStatus) -> list[Request]:
    return [r for r in self.requests.values() if r.status is status]

  def _check_batch(self, batch: ScheduledBatch) -> None:
    assert batch.num_tokens <= self.config.max_num_batched_tokens
    assert batch.num_seqs <= self.config.max_num_seqs
    ids = [s.request_id for s in batch.seqs]
    assert len(set(ids)) == len(ids)
    is_decode = [s.num_tokens == 1 and s.sample for s in batch.seqs]
    assert is_decode == sorted(is_decode, reverse=True), "decodes must come first"
    for request_id in batch.preempted_request_ids:
      request = self.requests[request_id]
      assert request_id not in ids and request.status is RequestStatus.WAITING
      assert request.page_ids == [] and request.num_computed_tokens == 0
    if batch.preempted_request_ids:
      assert self.scheduler.num_preemptions_total > 0
    num_steps = batch.num_steps
    if num_steps > 1:
      assert all(s.num_tokens == 1 and s.sample for s in batch.seqs)
      assert not batch.preempted_request_ids
    for seq in batch.seqs:
      request = self.requests[seq.request_id]
      assert request.status is RequestStatus.RUNNING and seq.num_tokens >= 1
      known = request.all_token_ids[seq.start_position : seq.seq_len]
      num_placeholders = seq.num_tokens - len(known)
      assert list(seq.token_ids) == known + [PLACEHOLDER_TOKEN_ID] * num_placeholders
      pending = len(self.in_flight.get(request.request_id, []))
      assert num_placeholders <= min(pending, 1)
      computed_end = seq.start_position + (num_steps if num_steps > 1 else seq.num_tokens)
      num_sampled = num_steps if num_steps > 1 else seq.sample
      # a burst's pages cover the positions still needed: up to the last one that samples
      paged_end = min(computed_end, request.max_total_tokens - 1) if num_steps > 1 else computed_end
      assert request.num_computed_tokens == computed_end
      assert paged_end <= self.max_model_len
      assert request.num_output_placeholders == num_sampled + pending
      if num_steps > 1:  # fed the last known token; all the burst's samples are placeholders
        assert seq.seq_len == request.num_tokens_with_placeholders - num_steps
      else:
        assert seq.sample == (seq.seq_len == request.num_tokens_with_placeholders - seq.sample)
      assert request.num_tokens_with_placeholders <= request.max_total_tokens + num_steps - 1
      assert seq.page_ids == tuple(request.page_ids) and 0 not in seq.page_ids
      assert len(seq.page_ids) == _ceil_div(paged_end, self.page_size)
      assert seq.window_page_ids == tuple(tuple(t) for t in request.window_page_ids)
      for window, table in zip(self.windows, seq.window_page_ids, strict=True):
        assert 0 not in table[_first_seen_page(seq.start_position, window, self.page_size) :]
      if not self.config.enable_chunked_prefill and not seq.sample:
        assert request.num_tokens > self.config.max_num_batched_tokens

  def _check_mixed_step(self, batch: ScheduledBatch, waiting_ids: set[str]) -> None:
    """A step in which D requests decode carries at most max(mixed_step_prefill_tokens, budget x
    (max_num_seqs - D) / max_num_seqs) prompt tokens, and no more tokens than the step budget
    allows D decoding streams (engine/step_budget.py; D here counts the batch's decodes, at
    most the scheduler's D, so the bound is never tighter). A decode: a running request's
    one-token query past its prompt that samples (an admission never is)."""
    cap = self.config.mixed_step_prefill_tokens
    decodes = [
      s
      for s in batch.seqs
      if s.request_id not in waiting_ids
      and s.num_tokens == 1
      and s.sample
      and s.start_position >= self.requests[s.request_id].num_prompt_tokens
    ]
    if cap is not None and decodes and batch.num_steps == 1:
      budget, slots = self.config.max_num_batched_tokens, self.config.max_num_seqs
      assert batch.num_tokens - len(decodes) <= max(cap, budget * (slots - len(decodes)) // slots)
    if batch.num_steps == 1:  # no more tokens than the streams allow (the rule's D bound it)
      assert batch.num_tokens <= self.step_budget.largest_allowed(len(decodes))
      if batch.num_tokens > self.step_budget.latency_tokens:
        event("a step on a wide rung")

  def _record_events(self, batch: ScheduledBatch, waiting_ids: set[str]) -> None:
    if batch.preempted_request_ids:
      event("preemption")
    if any(self.requests[r].num_output_placeholders for r in batch.preempted_request_ids):
      event("preempted with a token in flight")
    if any(t == PLACEHOLDER_TOKEN_ID for seq in batch.seqs for t in seq.token_ids):
      event("fed a token in flight")
    for seq in batch.seqs:
      if seq.request_id in waiting_ids and seq.start_position > 0:
        event("prefix cache hit")
        if any(0 in table for table in seq.window_page_ids):
          event("prefix cache hit below a window")
      if seq.request_id in waiting_ids and self.requests[seq.request_id].num_preemptions:
        event("resumed after preemption")

  def _simulate_kv(self, batch: ScheduledBatch, waiting_ids: set[str]) -> dict[str, list[int]]:
    """Writes every position the step computes (a burst: one per decode step, each step's
    sample fed to the next) in every KV group, then reads back what the step's queries see
    (group 0: the whole context; a sliding group: from its first query's window on); returns
    each sequence's samples. A burst step past the sequence's pages writes nowhere (the device's
    null page). Every sequence writes before any reads, as every layer writes the step's K/V
    before its queries read: a page a sequence writes is its own (refcount 1) unless a request
    admitted in this step took it as a prefix hit, and then that request's reads check that it
    sees what the writer wrote."""
    page_size, sampled = self.page_size, {}
    hit_now = {
      page_id
      for seq in batch.seqs
      if seq.request_id in waiting_ids
      for table in (seq.page_ids, *seq.window_page_ids)
      for page_id in table[: seq.start_position // page_size]
    }
    computed = []
    for seq in batch.seqs:
      tokens = self._device_tokens(self.requests[seq.request_id])
      assert len(tokens) >= seq.seq_len
      end = seq.start_position + batch.num_steps if batch.num_steps > 1 else seq.seq_len
      paged_end = min(end, len(seq.page_ids) * page_size)
      assert batch.num_steps > 1 or paged_end == end
      for position in range(seq.start_position, paged_end):
        if batch.num_steps > 1 or position == end - 1:
          if position + 1 == len(tokens) and seq.sample:
            tokens.append(_next_token(tokens))
      tables = [(None, seq.page_ids), *zip(self.windows, seq.window_page_ids, strict=True)]
      for group, (_, table) in enumerate(tables):
        for position in range(seq.start_position, paged_end):
          page_id = table[position // page_size]
          assert page_id != 0 and self.allocator.group_of(page_id) == group
          shared = self.allocator.refcount(page_id) > 1
          assert not shared or page_id in hit_now, "wrote into a shared page"
          if shared:
            event("wrote a page another request takes in the same step")
          self.kv[(page_id, position % page_size)] = (group, tuple(tokens[: position + 1]))
      computed.append((seq, tokens, tables, end, paged_end))
    for seq, tokens, tables, end, paged_end in computed:
      for group, (window, table) in enumerate(tables):
        seen = 0 if window is None else max(0, seq.start_position - window + 1)
        for position in range(seen, paged_end):
          slot = (table[position // page_size], position % page_size)
          want = (group, tuple(tokens[: position + 1]))
          assert self.kv.get(slot) == want, f"wrong K/V at {position} in group {group}"
      if seq.sample:
        sampled[seq.request_id] = tokens[seq.seq_len : end + 1]
    return sampled


SchedulerMachine.TestCase.settings = settings(
  max_examples=600,
  stateful_step_count=50,
  deadline=None,
  database=None,
  phases=[p for p in Phase if p is not Phase.explain],
  suppress_health_check=[HealthCheck.too_slow],
)
TestScheduler = SchedulerMachine.TestCase
