"""Bucketed batch shapes: every step is padded to one (num_seqs, num_tokens) pair from two
ladders, so XLA compiles each pair once and never again.

Both sides read the ladders: the host picks each step's bucket (the smallest *ready* one that
holds the batch: BucketSet.pick with ProgramReadiness's buckets, messages/program_readiness.py)
and the device compiles and pads to it. Plain data, no jax.

The default ladders are geometric from the config's limits: each rung at most 1 / (1 -
bucket_padding) times the one below (bucket_padding 0.5: powers of two), so a batch one past a
rung is padded by at most a bucket_padding share of its bucket; `padding_waste` states it.

Wide rungs (scheduler.latency_batched_tokens = L below max_num_batched_tokens B): the token
ladder is dense (geometric) up to L and grows on from L to B by the same factor; a token rung
above L (`BucketSet.wide_above`) pairs with the largest sequence rung only, so each costs one
bucket, not one per sequence rung. A step that large carries prompt chunks, where padding its
sequence count costs little beside its tokens, and the step budget (engine/step_budget.py)
takes such a rung only when the step fills it.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

MIN_SEQ_BUCKET = 8
# The token ladder starts where the sequence ladder does: a decode step of up to 8 sequences
# runs at 8 token rows, not 16 (docs/DECISIONS.md, "The token ladder starts at 8 rows").
MIN_TOKEN_BUCKET = MIN_SEQ_BUCKET
# with_pool_rungs: the KV pool's capacity and its doublings, POOL_RUNGS of them, each added
# only where the next rung up is more than POOL_RUNG_GAP times it
POOL_RUNGS = 3
POOL_RUNG_GAP = 1.25


class BucketLimits(Protocol):
  """What the ladders are derived from (config.SchedulerConfig)."""

  max_num_seqs: int
  max_num_batched_tokens: int
  seq_buckets: tuple[int, ...] | None
  token_buckets: tuple[int, ...] | None
  bucket_padding: float
  latency_batched_tokens: int | None


@dataclass(frozen=True, order=True)
class Bucket:
  num_seqs: int
  num_tokens: int


def geometric_ladder(start: int, limit: int, padding: float) -> tuple[int, ...]:
  """start, then rungs growing by at most 1 / (1 - padding), each a multiple of start (the
  kernels' tiles like aligned shapes), ending at limit."""
  values, value = [], start
  while value < limit:
    values.append(value)
    value = max(value + start, math.floor(value / (1.0 - padding)) // start * start)
  values.append(limit)
  return tuple(values)


@dataclass(frozen=True)
class BucketSet:
  """Sequence-count and token-count ladders; a bucket is any pair with num_tokens >= num_seqs,
  except that a token rung above wide_above (None: none is) pairs with the largest sequence rung
  only (module docstring)."""

  seq_buckets: tuple[int, ...]
  token_buckets: tuple[int, ...]
  wide_above: int | None = None

  @classmethod
  def from_config(cls, config: BucketLimits) -> BucketSet:
    padding, limit = config.bucket_padding, config.max_num_batched_tokens
    dense = config.latency_batched_tokens or limit  # the dense ladder's top
    seq = config.seq_buckets or geometric_ladder(
      min(MIN_SEQ_BUCKET, config.max_num_seqs), config.max_num_seqs, padding
    )
    tokens = config.token_buckets or (
      geometric_ladder(min(MIN_TOKEN_BUCKET, dense), dense, padding)
      + geometric_ladder(dense, limit, padding)[1:]
    )
    return cls(tuple(seq), tuple(tokens), dense if dense < limit else None)

  def wide_rungs(self) -> tuple[int, ...]:
    """The token rungs above wide_above, smallest first (none without it)."""
    if self.wide_above is None:
      return ()
    return tuple(t for t in self.token_buckets if t > self.wide_above)

  def with_pool_rungs(self, capacity: int) -> BucketSet:
    """This set with sequence rungs where a KV pool that holds `capacity` sequences of the
    longest length bounds the batch: the capacity, twice and four times it (POOL_RUNGS; the
    first rounded up to MIN_SEQ_BUCKET), below the largest rung, each kept only where the next
    rung up is more than POOL_RUNG_GAP times it. A batch the pool bounds runs between the
    capacity (every sequence at full length) and a few times it (short ones), and a sparse
    ladder would pad it to the next rung (an offline ladder of [64, 512] runs 170 sequences at
    512)."""
    ladder = list(self.seq_buckets)
    first = -(-max(capacity, 1) // MIN_SEQ_BUCKET) * MIN_SEQ_BUCKET
    for rung in (first << k for k in range(POOL_RUNGS)):
      index = bisect.bisect_left(ladder, rung)
      if index < len(ladder) and ladder[index] > rung * POOL_RUNG_GAP:
        ladder.insert(index, rung)
    return BucketSet(tuple(ladder), self.token_buckets, self.wide_above)

  def pick(self, num_seqs: int, num_tokens: int, ready: Collection[Bucket] | None = None) -> Bucket:
    """The smallest bucket holding num_seqs sequences and num_tokens tokens; with `ready`, the
    smallest of those (fewest tokens, then fewest sequences: a step's cost follows its tokens)."""
    seqs = self._ceil(self.seq_buckets, num_seqs, "num_seqs")
    tokens = self._ceil(self.token_buckets, max(num_tokens, seqs), "num_tokens")
    if self.wide_above is not None and tokens > self.wide_above:  # a wide rung
      seqs = self.seq_buckets[-1]
      tokens = self._ceil(self.token_buckets, max(num_tokens, seqs), "num_tokens")
    smallest = Bucket(seqs, tokens)
    if ready is None or smallest in ready:
      return smallest
    fits = [b for b in ready if b.num_seqs >= seqs and b.num_tokens >= smallest.num_tokens]
    if not fits:
      raise ValueError(f"no compiled bucket holds {num_seqs} sequences and {num_tokens} tokens")
    return min(fits, key=lambda b: (b.num_tokens, b.num_seqs))

  def all(self) -> list[Bucket]:
    buckets = {self.pick(s, t) for s in self.seq_buckets for t in self.token_buckets if t >= s}
    return sorted(buckets)

  def largest(self) -> Bucket:
    """The bucket every step fits (padded to it)."""
    return Bucket(self.seq_buckets[-1], self.token_buckets[-1])

  def decode_buckets(self) -> list[Bucket]:
    """Every bucket a decode-only batch (as many tokens as sequences) can take."""
    return sorted({self.pick(n, n) for n in self.seq_buckets})

  @staticmethod
  def _ceil(ladder: tuple[int, ...], value: int, name: str) -> int:
    index = bisect.bisect_left(ladder, value)
    if index == len(ladder):
      raise ValueError(f"{name}: {value} exceeds the largest bucket {ladder[-1]}")
    return ladder[index]

  def describe(self) -> str:
    wide = self.wide_rungs()
    dense = self.token_buckets[: len(self.token_buckets) - len(wide)]
    return (
      f"seqs {list(self.seq_buckets)} x tokens {list(dense)}"
      + (f", wide {list(wide)} x seqs {self.seq_buckets[-1]}" if wide else "")
      + f" ({len(self.all())} buckets; {padding_waste(self.seq_buckets):.0%} / "
      f"{padding_waste(dense):.0%} padding at most)"
    )


def padding_waste(ladder: tuple[int, ...]) -> float:
  """The largest share of a bucket that padding can fill: a batch one past a rung, padded to
  the next rung (the first rung, whose padding depends on the smallest batches, left out)."""
  return max([(high - low - 1) / high for low, high in itertools.pairwise(ladder)], default=0.0)
