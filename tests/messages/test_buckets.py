"""The bucket ladders and the host's pick among ready buckets, hand-computed."""

from __future__ import annotations

import pytest

from jaxserve.config import SchedulerConfig
from jaxserve.messages.buckets import Bucket, BucketSet, geometric_ladder, padding_waste


def test_default_ladders_are_powers_of_two_and_state_their_padding():
  buckets = BucketSet.from_config(SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512))
  assert buckets.seq_buckets == (8, 16, 32, 64)
  assert buckets.token_buckets == (8, 16, 32, 64, 128, 256, 512)  # a decode of 8 at 8 rows
  # 257 tokens padded to 512: 255 of 512 slots are padding
  assert padding_waste(buckets.token_buckets) == pytest.approx(255 / 512)
  assert "22 buckets; 48% / 50% padding at most" in buckets.describe()


def test_a_finer_ladder_from_bucket_padding():
  # rungs grow by at most 1 / 0.75, each a multiple of the first (16)
  assert geometric_ladder(16, 256, 0.25) == (16, 32, 48, 64, 80, 96, 128, 160, 208, 256)
  assert padding_waste((16, 32, 48, 64)) == pytest.approx(15 / 32)
  with pytest.raises(ValueError, match="scheduler.bucket_padding"):
    SchedulerConfig(bucket_padding=1.0)


def test_pick_takes_the_smallest_ready_bucket():
  buckets = BucketSet((8, 16), (16, 32, 64))
  assert buckets.pick(3, 20) == Bucket(8, 32)
  ready = frozenset({Bucket(16, 64), Bucket(8, 64)})
  assert buckets.pick(3, 20, ready) == Bucket(8, 64)
  assert buckets.pick(12, 20, ready) == Bucket(16, 64)
  assert buckets.pick(3, 20, None) == Bucket(8, 32)  # None: every bucket usable
  with pytest.raises(ValueError, match="no compiled bucket holds"):
    buckets.pick(3, 20, frozenset({Bucket(16, 16)}))


def test_pool_rungs_where_the_kv_pool_bounds_the_batch():
  offline = BucketSet((64, 512), (512, 2048, 8192))
  # 170 sequences of the longest length: rungs at 176 and 352 (704 is past the largest)
  assert offline.with_pool_rungs(170).seq_buckets == (64, 176, 352, 512)
  # 112: 112 and 224; 448 is within 1.25x of 512, so 512 serves it
  assert offline.with_pool_rungs(112).seq_buckets == (64, 112, 224, 512)
  # a pool that holds every sequence adds nothing; nor does a rung already there
  assert offline.with_pool_rungs(860).seq_buckets == (64, 512)
  assert offline.with_pool_rungs(64).seq_buckets == (64, 128, 256, 512)
  # a small pool: rungs below the smallest too
  assert offline.with_pool_rungs(3).seq_buckets == (8, 16, 32, 64, 512)
  assert offline.with_pool_rungs(170).token_buckets == offline.token_buckets


def test_wide_rungs_above_the_latency_budget_pair_with_the_largest_sequence_rung():
  """The serve default of a large GPU: dense to 2,048 tokens, then 4,096 and 8,192 with 512
  sequences only: 42 dense buckets (the 39 of 256 / 2,048 and 512 x 512, 1,024, 2,048) and one
  per wide rung, where a dense ladder to 8,192 would pair every sequence rung: 56."""
  config = SchedulerConfig(512, 8192, latency_batched_tokens=2048)
  buckets = BucketSet.from_config(config)
  assert buckets.seq_buckets == (8, 16, 32, 64, 128, 256, 512)
  assert buckets.token_buckets == (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
  assert buckets.wide_above == 2048 and buckets.wide_rungs() == (4096, 8192)
  assert len(buckets.all()) == 44
  assert [b for b in buckets.all() if b.num_tokens > 2048] == [Bucket(512, 4096), Bucket(512, 8192)]
  assert len(BucketSet.from_config(SchedulerConfig(512, 8192)).all()) == 56
  assert buckets.pick(20, 3000) == Bucket(512, 4096)  # the sequences padded, not the tokens
  assert buckets.pick(20, 2048) == Bucket(32, 2048)
  assert buckets.pick(300, 301) == Bucket(512, 512)
  assert "wide [4096, 8192] x seqs 512 (44 buckets" in buckets.describe()
  assert buckets.with_pool_rungs(300).wide_above == 2048
  # without a latency budget nothing is wide; a user's ladder keeps its rungs, those above the
  # latency budget wide
  assert BucketSet.from_config(SchedulerConfig(512, 8192)).wide_rungs() == ()
  own = SchedulerConfig(64, 1024, latency_batched_tokens=256, token_buckets=(64, 256, 512, 1024))
  assert BucketSet.from_config(own).wide_rungs() == (512, 1024)


def test_latency_batched_tokens_is_validated():
  for bad in (0, 63, 1025, 2.5, "many", True):
    with pytest.raises(ValueError, match="scheduler.latency_batched_tokens"):
      SchedulerConfig(64, 1024, latency_batched_tokens=bad)
  assert SchedulerConfig(64, 1024, latency_batched_tokens=1024).latency_batched_tokens == 1024
