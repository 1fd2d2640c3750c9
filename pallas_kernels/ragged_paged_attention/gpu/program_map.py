"""Which query block each program of the GPU attention kernel attends (gpu.py).

The kernel's grid has `num_programs(T, S, block_q)` programs per kv head. The live sequences'
query blocks (cdiv(q_len, block_q) each) are numbered one after the other; `program_map` gives
program b < L (L blocks in all) its sequence and block, and every later program a block of
padding tokens to zero. It is a few small XLA ops on the step's metadata, the same for every
layer, so each program starts from two scalar loads instead of a search over query_start_loc.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl


def num_programs(num_tokens: int, num_seq_slots: int, block_q: int) -> int:
  """Programs along grid axis 0: enough for every live sequence's query blocks (at most
  (T + S * (block_q - 1)) / block_q) plus one program per block of padding tokens."""
  return pl.cdiv(num_tokens + num_seq_slots * (block_q - 1), block_q) + 1


def program_map(query_start_loc, num_seqs, num_programs: int, block_q: int):
  """(program_seqs, program_blocks), each int32[num_programs]: program b < L (L = the live
  sequences' query blocks, numbered sequence by sequence) attends query block
  program_blocks[b] of sequence program_seqs[b]; program b >= L gets sequence -1 and zeros
  token block program_blocks[b] (from num_live // block_q on, past the live tokens)."""
  num_slots = query_start_loc.shape[0] - 1
  live = jnp.arange(num_slots) < num_seqs[0]  # [S]
  q_lens = query_start_loc[1:] - query_start_loc[:-1]  # [S]
  blocks = jnp.where(live, (q_lens + block_q - 1) // block_q, 0)  # [S]
  ends = jnp.cumsum(blocks).astype(jnp.int32)  # [S]
  programs = jnp.arange(num_programs, dtype=jnp.int32)  # [G]
  seqs = jnp.sum(ends[None, :] <= programs[:, None], axis=1, dtype=jnp.int32)  # [G]
  num_live_blocks = ends[-1]
  clamped = jnp.minimum(seqs, num_slots - 1)
  seq_blocks = programs - (ends - blocks)[clamped]  # [G]
  padding_blocks = query_start_loc[num_seqs[0]] // block_q + programs - num_live_blocks
  is_live = programs < num_live_blocks
  return (
    jnp.where(is_live, clamped, -1).astype(jnp.int32),
    jnp.where(is_live, seq_blocks, padding_blocks).astype(jnp.int32),
  )
