"""How many prompt tokens a scheduler step may carry while requests decode. Pure Python, no jax.

Mixed steps (config.mixed_step_prefill_tokens = P): when D > 0 running requests decode this
step, the step's prompt tokens (the running prompts' chunks and the admissions) stop at
max(P, B x (S - D) / S) for the token budget B (max_num_batched_tokens) and S (max_num_seqs).
A full batch's streams then get steps a bounded time longer than decode-only ones, so their
gaps between tokens stay even while prompts arrive, and a batch with idle slots refills at the
pace of the budget its idle slots stand for. With P unset, nothing decoding, or a prefill-only
step (config.prefill_first), a step's prompts may take the whole budget.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import SchedulerConfig  # relative imports: this side never touches jax
from .request import Request


def is_decoding(request: Request) -> bool:
  """Whether the request's next chunk is one decode token (not a prompt chunk)."""
  start = request.num_computed_tokens
  return start == request.num_tokens_with_placeholders - 1 and start >= request.num_prompt_tokens


def prefill_budget_of(
  config: SchedulerConfig, running: Sequence[Request], prefills_only: bool
) -> int:
  """The step's prompt tokens at most (see the module docstring)."""
  cap, budget = config.mixed_step_prefill_tokens, config.max_num_batched_tokens
  if cap is None or prefills_only:
    return budget
  num_decoding = sum(map(is_decoding, running))
  if num_decoding == 0:
    return budget
  slots = config.max_num_seqs
  return max(cap, budget * max(0, slots - num_decoding) // slots)
