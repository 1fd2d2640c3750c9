"""The GPU kernel's program map, checked on random ragged batches: every live query token is
attended by exactly one program (a block of its own sequence), every padding token is zeroed by a
padding program, and the static grid is always large enough. Hand-worked first.

The random batches come in the shapes the engine uses (a sequence bucket of slots, a token bucket
of tokens), so the sweep compiles one program per (slots, tokens) pair rather than one per batch;
half of them fill their token bucket with live tokens (no padding), where the grid bound is
tightest."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ragged_paged_attention.gpu.program_map import num_programs, program_map

SEQ_BUCKETS = (1, 2, 4, 8, 12)
TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _program_map(query_start_loc, num_seqs, num_programs: int, block_q: int):
  return program_map(query_start_loc, num_seqs, num_programs, block_q)


def _map(q_lens: list[int], num_slots: int, num_tokens: int, block_q: int):
  starts = np.zeros(num_slots + 1, np.int32)
  starts[1 : len(q_lens) + 1] = np.cumsum(q_lens)
  starts[len(q_lens) + 1 :] = starts[len(q_lens)]
  grid = num_programs(num_tokens, num_slots, block_q)
  seqs, blocks = _program_map(
    jnp.asarray(starts), jnp.asarray([len(q_lens)], jnp.int32), grid, block_q
  )
  return starts, np.asarray(seqs), np.asarray(blocks)


def test_by_hand():
  # 3 live sequences of 5, 0 and 2 query tokens in 4 slots of a 12-token bucket, blocks of 4:
  # sequence 0 has blocks 0 and 1, sequence 2 block 0; tokens 7..11 are padding (blocks 1, 2)
  _, seqs, blocks = _map([5, 0, 2], num_slots=4, num_tokens=12, block_q=4)
  assert seqs.size == num_programs(12, 4, 4) == 7
  assert seqs.tolist() == [0, 0, 2, -1, -1, -1, -1]
  assert blocks.tolist() == [0, 1, 0, 1, 2, 3, 4]


@pytest.mark.parametrize("block_q", [1, 2, 4, 16])
def test_random_batches_are_covered(block_q: int):
  rng = np.random.default_rng(block_q)
  for _ in range(200):
    num_slots = int(rng.choice(SEQ_BUCKETS))
    num_seqs = int(rng.integers(0, num_slots + 1))
    q_lens = [
      int(rng.choice([0, 1, 1, 2, block_q, block_q + 1, rng.integers(1, 40)]))
      for _ in range(num_seqs)
    ]
    num_tokens = next(t for t in TOKEN_BUCKETS if t >= sum(q_lens) + rng.integers(0, 3 * block_q))
    if q_lens and rng.random() < 0.5:  # the last sequence takes the rest: no padding tokens
      q_lens[-1] += num_tokens - sum(q_lens)
    num_live = sum(q_lens)
    starts, seqs, blocks = _map(q_lens, num_slots, num_tokens, block_q)
    attended = np.zeros(num_tokens, np.int32)
    zeroed = np.zeros(num_tokens, bool)
    for seq, block in zip(seqs.tolist(), blocks.tolist(), strict=True):
      if seq >= 0:
        first = block * block_q
        assert 0 <= first < q_lens[seq], (q_lens, seq, block)  # no program without work
        tokens = starts[seq] + np.arange(first, min(first + block_q, q_lens[seq]))
        attended[tokens] += 1
      else:
        tokens = np.arange(block * block_q, (block + 1) * block_q)
        zeroed[tokens[(tokens >= num_live) & (tokens < num_tokens)]] = True
    assert (attended[:num_live] == 1).all() and (attended[num_live:] == 0).all()
    assert zeroed[num_live:].all(), (q_lens, num_slots, num_tokens)
