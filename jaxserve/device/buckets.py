"""Bucketed batch shapes: every step is padded to one (num_seqs, num_tokens) pair from a small set,
so XLA compiles each pair once at warmup and never again."""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from jaxserve.config import SchedulerConfig

MIN_SEQ_BUCKET = 8
MIN_TOKEN_BUCKET = 16


@dataclass(frozen=True, order=True)
class Bucket:
  num_seqs: int
  num_tokens: int


def _powers_of_two(start: int, limit: int) -> tuple[int, ...]:
  values, value = [], start
  while value < limit:
    values.append(value)
    value *= 2
  values.append(limit)
  return tuple(values)


@dataclass(frozen=True)
class BucketSet:
  """Sequence-count and token-count ladders; a bucket is any pair with num_tokens >= num_seqs."""
  seq_buckets: tuple[int, ...]
  token_buckets: tuple[int, ...]

  @classmethod
  def from_config(cls, config: SchedulerConfig) -> "BucketSet":
    seq = config.seq_buckets or _powers_of_two(min(MIN_SEQ_BUCKET, config.max_num_seqs),
                                               config.max_num_seqs)
    tokens = config.token_buckets or _powers_of_two(
        min(MIN_TOKEN_BUCKET, config.max_num_batched_tokens), config.max_num_batched_tokens)
    return cls(tuple(seq), tuple(tokens))

  def pick(self, num_seqs: int, num_tokens: int) -> Bucket:
    """The smallest bucket holding num_seqs sequences and num_tokens tokens."""
    seqs = self._ceil(self.seq_buckets, num_seqs, "num_seqs")
    tokens = self._ceil(self.token_buckets, max(num_tokens, seqs), "num_tokens")
    return Bucket(seqs, tokens)

  def all(self) -> list[Bucket]:
    buckets = {self.pick(s, t) for s in self.seq_buckets for t in self.token_buckets if t >= s}
    return sorted(buckets)

  @staticmethod
  def _ceil(ladder: tuple[int, ...], value: int, name: str) -> int:
    index = bisect.bisect_left(ladder, value)
    if index == len(ladder):
      raise ValueError(f"{name}: {value} exceeds the largest bucket {ladder[-1]}")
    return ladder[index]

  def describe(self) -> str:
    return f"seqs {list(self.seq_buckets)} x tokens {list(self.token_buckets)} ({len(self.all())} buckets)"
