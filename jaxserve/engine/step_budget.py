"""The step budget: how many tokens a scheduler step may carry, and how many of them prompt
tokens, as the load changes. Pure Python, no jax; the one owner of the rule
(engine/scheduler.py asks it once per planned step).

Its inputs: D, the running requests that decode this step (a prefill-only step counts none);
the limits B (scheduler.max_num_batched_tokens), S (max_num_seqs), L
(latency_batched_tokens) and P (mixed_step_prefill_tokens); and the token ladder's wide rungs
(messages/buckets.py: the rungs above L, up to B).

A fixed budget (L unset or equal to B): a step carries at most B tokens. With P set, a step in
which D > 0 requests decode carries at most max(P, B x (S - D) / S) prompt tokens (its running
prompts' chunks and its admissions), so a full batch's steps that also prefill run a bounded
time longer than decode-only ones, and a batch with idle slots refills at the pace of the budget
its idle slots stand for.

A budget that follows the load (L < B): a step carries at most L tokens (the latency budget, a
full batch's step), or a wide rung r of the token ladder when both hold:
  - the streams allow it: D x (r - D) <= S x (L - S). The time a step's prompt tokens add to
    each decoding stream's gap, summed over its D streams, is at most what a full batch's step
    of L tokens adds to its S streams: a lone long prompt, or a batch refilling from empty,
    gets large chunks, and the more requests decode the smaller the chunk (never below L);
  - the work at hand fills it: D + A >= r, where A counts the prompt tokens the step could
    take (the running prompts' known tokens not yet computed, then the waiting requests' known
    tokens, as many requests as the free slots admit, in queue order). A wide rung pairs with
    the largest sequence rung only and the bucket ladder is sparse there, so a step that did not
    fill its rung would pay for the padding: it stays at L (or a smaller wide rung) instead.
The step's prompt tokens are then at most its budget less D (every decode fits), and under P as
above. A's count does not foresee prefix-cache hits or a pool that runs out of pages: such a
step may carry fewer tokens than its rung. Without chunked prefill a prompt must fit its step
whole: when the next one to admit does not fit the budget above, the step takes the smallest
rung the streams allow that holds it (padded), or the largest they allow (the prompt waits for
fewer decoding streams; with none decoding every rung is allowed, so it is admitted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..config import SchedulerConfig  # relative imports: this side never touches jax
from ..messages.buckets import BucketSet
from .request import Request


def is_decoding(request: Request) -> bool:
  """Whether the request's next chunk is one decode token (not a prompt chunk)."""
  start = request.num_computed_tokens
  return start == request.num_tokens_with_placeholders - 1 and start >= request.num_prompt_tokens


@dataclass(frozen=True)
class StepLimit:
  """What one step may carry: `tokens` in all, `prompt_tokens` of them prompt tokens."""

  tokens: int
  prompt_tokens: int


@dataclass(frozen=True)
class StepBudget:
  """The rule of the module docstring for one scheduler config."""

  max_tokens: int  # B
  max_seqs: int  # S
  latency_tokens: int  # L (B: a fixed budget)
  prefill_floor: int | None  # P
  wide_rungs: tuple[int, ...]  # the token rungs above L, smallest first

  @classmethod
  def of(cls, config: SchedulerConfig) -> StepBudget:
    buckets = BucketSet.from_config(config)
    return cls(
      config.max_num_batched_tokens,
      config.max_num_seqs,
      config.latency_batched_tokens or config.max_num_batched_tokens,
      config.mixed_step_prefill_tokens,
      buckets.wide_rungs(),
    )

  @property
  def counts_decoding(self) -> bool:
    """Whether the limit depends on D at all (a wide rung or P); else D may be given as 0."""
    return bool(self.wide_rungs) or self.prefill_floor is not None

  def streams_allow(self, rung: int, num_decoding: int) -> bool:
    """Whether D decoding streams may share a step of `rung` tokens (module docstring)."""
    latency, seqs = self.latency_tokens, self.max_seqs
    return num_decoding * (rung - num_decoding) <= seqs * (latency - seqs)

  def largest_allowed(self, num_decoding: int) -> int:
    """The largest token count the streams allow a step (L, or the largest wide rung)."""
    allowed = [r for r in self.wide_rungs if self.streams_allow(r, num_decoding)]
    return allowed[-1] if allowed else self.latency_tokens

  def step_tokens(self, num_decoding: int, available: int, whole: int = 0) -> int:
    """The step's token budget: L, or the largest wide rung the streams allow and the
    `available` prompt tokens fill; `whole`: a prompt that must fit the step whole (no chunked
    prefill; module docstring)."""
    tokens = self.latency_tokens
    for rung in self.wide_rungs:
      if num_decoding + available < rung or not self.streams_allow(rung, num_decoding):
        break
      tokens = rung
    if whole and num_decoding + whole > tokens:
      holds = [r for r in self.wide_rungs if r >= num_decoding + whole]
      allowed = [r for r in holds if self.streams_allow(r, num_decoding)]
      tokens = allowed[0] if allowed else self.largest_allowed(num_decoding)
    return tokens

  def limit(
    self, num_decoding: int, available: int, prefills_only: bool, whole: int = 0
  ) -> StepLimit:
    """The step's limits with D = num_decoding (0 for a prefill-only step)."""
    if not self.wide_rungs:
      return StepLimit(self.max_tokens, self._prefill_cap(num_decoding, prefills_only))
    tokens = self.step_tokens(num_decoding, available, whole)
    prompt = min(tokens - num_decoding, self._prefill_cap(num_decoding, prefills_only))
    return StepLimit(tokens, max(1, prompt))

  def _prefill_cap(self, num_decoding: int, prefills_only: bool) -> int:
    cap, budget, slots = self.prefill_floor, self.max_tokens, self.max_seqs
    if cap is None or prefills_only or num_decoding == 0:
      return budget
    return max(cap, budget * max(0, slots - num_decoding) // slots)


def prompt_work(
  running: Sequence[Request], waiting: Iterable[Request], free_slots: int, enough: int
) -> int:
  """A: the prompt tokens a step could take, counted until `enough`: the running prompts'
  known tokens not yet computed, then the known tokens of the first `free_slots` waiting
  requests (stopping at one preempted with a token in flight, which admission waits for)."""
  work = 0
  for request in running:
    if not is_decoding(request) and request.num_tokens_with_placeholders < request.max_total_tokens:
      work += request.num_tokens_with_placeholders - request.num_computed_tokens
  for request in waiting:
    if work >= enough or free_slots <= 0 or request.num_output_placeholders:
      break
    work += request.num_tokens
    free_slots -= 1
  return work
