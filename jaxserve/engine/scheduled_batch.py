"""What the scheduler hands to the device side for one step. Pure Python, no jax."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduledSeq:
  """One sequence's share of a step.

  token_ids are fed at positions start_position .. start_position + len(token_ids) - 1: a chunk
  of the prompt (prefill) or the last sampled token (decode). page_ids is the sequence's whole
  block table, covering every position up to the last fed token. sample is True when this step
  feeds the last known token, so a new token is sampled for the sequence; a prefill chunk that
  stops short of the end of the prompt does not sample.
  """
  request_id: str
  token_ids: tuple[int, ...]
  start_position: int
  page_ids: tuple[int, ...]
  sample: bool

  @property
  def num_tokens(self) -> int:
    return len(self.token_ids)

  @property
  def seq_len(self) -> int:
    """Tokens of this sequence in the cache once the step has written its K/V."""
    return self.start_position + len(self.token_ids)


@dataclass(frozen=True)
class ScheduledBatch:
  """A step's sequences (decodes first, then prefill chunks) and what the scheduler did."""
  seqs: tuple[ScheduledSeq, ...]
  preempted_request_ids: tuple[str, ...] = ()

  @property
  def num_seqs(self) -> int:
    return len(self.seqs)

  @property
  def num_tokens(self) -> int:
    return sum([len(s.token_ids) for s in self.seqs])

  @property
  def is_empty(self) -> bool:
    return not self.seqs
