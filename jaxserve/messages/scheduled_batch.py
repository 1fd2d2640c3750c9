"""The one message from the host side to the device side: everything a step needs. Pure
Python, no jax.

The scheduler's batch builder (engine/batch_builder.py) fills it; the device side
(device/step_inputs.py) pads it to a bucket and never sees a Request. It is plain data (tuples of
ints, bytes, frozen dataclasses), so it can cross a process boundary as it is.

A batch is stored column-wise (one flat tuple per field, sequences in batch order): building the
step inputs turns each column into one array, and the scheduler fills the columns without
creating an object per sequence. `ScheduledBatch.seqs` is the per-sequence view (`ScheduledSeq`),
built on first use; `ScheduledBatch.of` builds a batch from such a view. The sampling columns
(`BatchSampling`) hold one fixed row per sequence plus sparse extras for the few sequences whose
sampling needs more (banned ids, penalty history, logit bias, prompt-logprob targets, top-N
logprobs).

Structured outputs: `BatchSampling.bitmask_rows` names the rows whose next token is constrained
by a grammar. Their allowed-token mask depends on the token the step before sampled, so it is
not known when the batch is scheduled: the engine dispatches the forward, fills the mask on the
host while the device runs it, and sends it as a `TokenBitmask` for the sampler
(`ScheduledBatch.with_bitmask`), the device side's only input that arrives after the batch.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from jaxserve.messages.sampling_row import GREEDY_ROW

PLACEHOLDER_TOKEN_ID = -1  # a token sampled by the step in flight, fed from the device


@dataclass(frozen=True)
class SamplingExtras:
  """What one sequence's sampling needs beyond its row (absent for plain sampling)."""

  row: int  # the sequence's index in the batch
  banned_ids: tuple[int, ...] = ()  # masked while min_tokens is not reached
  penalty_prompt_ids: tuple[int, ...] | None = None  # penalty history; None: no penalties
  penalty_output_ids: tuple[int, ...] | None = None
  top_logprobs: bool = False  # the request asked for top-N logprobs
  prompt_targets: tuple[int, ...] | None = None  # per fed token: next prompt id, -1 where none
  logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs added to the logits


@dataclass(frozen=True)
class TokenBitmask:
  """The allowed tokens of each sequence slot for one step's sampler: token t of row s may be
  sampled iff bit t % 32 of words[s, t // 32] is set. Rows cover the step's bucket (at least the
  batch's sequences); a row of all ones (-1) is unconstrained (padding, unconstrained requests)."""

  words: np.ndarray  # int32[num_rows, ceil(vocab / 32)]


@dataclass(frozen=True)
class BatchSampling:
  """The sampling columns of a batch.

  rows: each sequence's sampling row (messages/sampling_row.py), joined; sample_index: tokens
  each sequence has generated so far (folded into its random key); extras: the sequences that need
  more, by row; bitmask_rows: the sampling rows constrained by a grammar (their sampler waits for
  a TokenBitmask), bitmask: that mask once filled.
  """

  rows: bytes
  sample_index: tuple[int, ...]
  extras: tuple[SamplingExtras, ...] = ()
  bitmask_rows: tuple[int, ...] = ()
  bitmask: TokenBitmask | None = None

  @classmethod
  def greedy(cls, num_seqs: int) -> BatchSampling:
    """Greedy, penalty-free sampling for num_seqs sequences (a batch built from seqs alone)."""
    return cls(GREEDY_ROW * num_seqs, (0,) * num_seqs)


@dataclass(frozen=True)
class ScheduledSeq:
  """One sequence's share of a step.

  token_ids are fed at positions start_position .. start_position + len(token_ids) - 1: a chunk
  of the prompt (prefill) or the last sampled token (decode). page_ids is the sequence's whole
  block table in KV group 0, covering every position up to the last fed token;
  window_page_ids[k] its table in group k + 1 (a sliding-window group, messages/kv_layout.py),
  as long, holding the null page 0 below the window. sample is True when this step feeds the
  last known token, so a new token is sampled for the sequence; a prefill chunk that stops
  short of the end of the prompt does not sample.
  """

  request_id: str
  token_ids: tuple[int, ...]
  start_position: int
  page_ids: tuple[int, ...]
  sample: bool
  window_page_ids: tuple[tuple[int, ...], ...] = ()

  @property
  def num_tokens(self) -> int:
    return len(self.token_ids)

  @property
  def seq_len(self) -> int:
    """Tokens of this sequence in the cache once the step has written its K/V."""
    return self.start_position + len(self.token_ids)


@dataclass(frozen=True)
class ScheduledBatch:
  """A step's sequences (decodes first, then prefill chunks) and what the scheduler did.

  Columns, one entry per sequence unless flat: request_ids, start_positions, query_lens (tokens
  fed), sample, page_counts (block table lengths); token_ids and page_ids are every sequence's
  tokens and block table (KV group 0), concatenated; window_page_ids[k] is group k + 1's column
  of block tables, laid out as page_ids (the same page_counts; empty with one KV group, the
  batch then as it always was). num_steps > 1 marks a decode burst: every sequence feeds
  one token and the device runs num_steps decode steps, each feeding the token the one before
  sampled. Equal when the columns, preemptions and step counts are (the scheduler's view;
  sampling columns are not compared). The defaults make an empty batch; `of` builds one from
  per-sequence views.
  """

  request_ids: tuple[str, ...] = ()
  start_positions: tuple[int, ...] = ()
  query_lens: tuple[int, ...] = ()
  sample: tuple[bool, ...] = ()
  page_counts: tuple[int, ...] = ()
  token_ids: tuple[int, ...] = ()
  page_ids: tuple[int, ...] = ()
  preempted_request_ids: tuple[str, ...] = ()
  num_steps: int = 1
  sampling: BatchSampling = field(default=BatchSampling(b"", ()), compare=False)
  window_page_ids: tuple[tuple[int, ...], ...] = ()

  @classmethod
  def of(
    cls,
    seqs: Sequence[ScheduledSeq],
    preempted_request_ids: Sequence[str] = (),
    num_steps: int = 1,
    sampling: BatchSampling | None = None,
  ) -> ScheduledBatch:
    """The batch of `seqs` (greedy sampling unless `sampling` says otherwise)."""
    num_windows = len(seqs[0].window_page_ids) if seqs else 0
    return cls(
      tuple(s.request_id for s in seqs),
      tuple(s.start_position for s in seqs),
      tuple(len(s.token_ids) for s in seqs),
      tuple(s.sample for s in seqs),
      tuple(len(s.page_ids) for s in seqs),
      tuple(itertools.chain.from_iterable(s.token_ids for s in seqs)),
      tuple(itertools.chain.from_iterable(s.page_ids for s in seqs)),
      tuple(preempted_request_ids),
      num_steps,
      sampling or BatchSampling.greedy(len(seqs)),
      tuple(
        tuple(itertools.chain.from_iterable(s.window_page_ids[k] for s in seqs))
        for k in range(num_windows)
      ),
    )

  def with_bitmask(self, bitmask: TokenBitmask) -> ScheduledBatch:
    """This batch with its constrained rows' mask (the columns are shared, not copied)."""
    return dataclasses.replace(self, sampling=dataclasses.replace(self.sampling, bitmask=bitmask))

  @functools.cached_property
  def seqs(self) -> tuple[ScheduledSeq, ...]:
    """The per-sequence view, built on first use."""
    token_ends = itertools.accumulate(self.query_lens)
    page_ends = itertools.accumulate(self.page_counts)
    seqs, token_start, page_start = [], 0, 0
    for i, (token_end, page_end) in enumerate(zip(token_ends, page_ends, strict=True)):
      seqs.append(
        ScheduledSeq(
          self.request_ids[i],
          self.token_ids[token_start:token_end],
          self.start_positions[i],
          self.page_ids[page_start:page_end],
          self.sample[i],
          tuple(column[page_start:page_end] for column in self.window_page_ids),
        )
      )
      token_start, page_start = token_end, page_end
    return tuple(seqs)

  @property
  def num_kv_groups(self) -> int:
    return 1 + len(self.window_page_ids)

  @property
  def num_seqs(self) -> int:
    return len(self.request_ids)

  @property
  def num_tokens(self) -> int:
    return len(self.token_ids)

  @property
  def is_empty(self) -> bool:
    return not self.request_ids

  def __repr__(self) -> str:
    return (
      f"ScheduledBatch(seqs={self.seqs!r}, "
      f"preempted_request_ids={self.preempted_request_ids!r}, num_steps={self.num_steps})"
    )
