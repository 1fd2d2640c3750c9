"""Random ragged paged-attention cases shared by the kernel tests and benchmarks.

`make_random_case` builds arrays in the layout `reference.py` defines: live sequences own
scattered, non-contiguous pages (page 0, the null page, is never handed to one), sequence slots
past the live ones are padding (empty block-table rows, zero lengths, query_start_loc repeating
the live token count) and token slots past the live tokens are padding whose new K/V write into
the null page. The pools are stacked [num_slots, ...] and the case reads and writes one slot
(kv_slot, by default a middle one of three), so a kernel that ignores the slot, or touches the
others, fails. Every array is filled with random values, never zeros, so a kernel that skips
work cannot pass by accident.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from pallas_kernels.ragged_paged_attention.kv_quant import quantize_kv

ATTENTION_ARG_NAMES = (
  "q",
  "k_pool",
  "v_pool",
  "kv_slot",
  "block_tables",
  "seq_lens",
  "query_start_loc",
  "num_seqs",
)
WRITE_ARG_NAMES = ("k_pool", "v_pool", "kv_slot", "new_k", "new_v", "slot_mapping")
DEFAULT_NUM_SLOTS, DEFAULT_KV_SLOT = 3, 1


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def _check_lengths(q_lens: Sequence[int], kv_lens: Sequence[int], num_seqs: int) -> None:
  if len(q_lens) != len(kv_lens):
    raise ValueError(f"make_random_case: q_lens has {len(q_lens)} entries, kv_lens {len(kv_lens)}")
  if len(q_lens) > num_seqs:
    raise ValueError(f"make_random_case: {len(q_lens)} live sequences exceed num_seqs={num_seqs}")
  for q_len, kv_len in zip(q_lens, kv_lens, strict=True):
    if not 0 <= q_len <= kv_len:
      raise ValueError(f"make_random_case: need 0 <= q_len <= kv_len, got {q_len}, {kv_len}")


def _block_tables(
  rng: np.random.Generator,
  kv_lens: Sequence[int],
  num_seqs: int,
  pages_per_seq: int,
  page_size: int,
  num_pages: int,
  shuffle_pages: bool,
) -> np.ndarray:
  """int32[num_seqs, pages_per_seq]; unused entries are 0, live pages are distinct ids >= 1."""
  pages_needed = [_cdiv(kv_len, page_size) for kv_len in kv_lens]
  free_ids = np.arange(1, num_pages, dtype=np.int32)
  if shuffle_pages:
    free_ids = rng.permutation(free_ids)
  tables = np.zeros((num_seqs, pages_per_seq), np.int32)
  cursor = 0
  for seq, count in enumerate(pages_needed):
    tables[seq, :count] = free_ids[cursor : cursor + count]
    cursor += count
  return tables


def _slot_mapping(
  block_tables: np.ndarray,
  q_lens: Sequence[int],
  kv_lens: Sequence[int],
  num_tokens: int,
  page_size: int,
) -> np.ndarray:
  """int32[num_tokens]: the slot of each new token; padding tokens write into page 0."""
  slots = np.zeros((num_tokens,), np.int32)
  token = 0
  for seq, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens, strict=True)):
    positions = np.arange(kv_len - q_len, kv_len)
    pages = block_tables[seq, positions // page_size]
    slots[token : token + q_len] = pages * page_size + positions % page_size
    token += q_len
  slots[token:] = _null_page_slots(num_tokens - token, page_size)
  return slots


def _null_page_slots(count: int, page_size: int) -> np.ndarray:
  """Slots of padding tokens: spread over the null page so duplicates are exercised."""
  return (np.arange(count, dtype=np.int32) % page_size).astype(np.int32)


def make_random_case(
  rng: np.random.Generator,
  *,
  num_seqs: int,
  q_lens: Sequence[int],
  kv_lens: Sequence[int],
  num_q_heads: int,
  num_kv_heads: int,
  head_dim: int,
  page_size: int,
  dtype: jnp.dtype = jnp.float32,
  num_pages_extra: int = 3,
  shuffle_pages: bool = True,
  num_tokens: int | None = None,
  pages_per_seq: int | None = None,
  num_slots: int = DEFAULT_NUM_SLOTS,
  kv_slot: int = DEFAULT_KV_SLOT,
) -> dict[str, jnp.ndarray]:
  """Returns a random ragged batch in the reference's layout.

  Args:
    num_seqs: sequence slots S; the first len(q_lens) are live, the rest padding.
    q_lens: query tokens of each live sequence this step (0 allowed).
    kv_lens: tokens of each live sequence in the cache after this step (seq_lens), >= q_len.
    num_pages_extra: pages beyond those the live sequences need (random, never attended).
    num_tokens: token slots T (default sum(q_lens) + 1, so one padding token exists).
    pages_per_seq: block-table width (default: enough for the longest sequence, at least 1).
    num_slots, kv_slot: the pools' slots and the one this case reads and writes.

  Returns a dict with the attention arguments (ATTENTION_ARG_NAMES: q [T, num_q_heads, head_dim],
  k_pool/v_pool [num_slots, num_kv_heads, num_pages, page_size, head_dim], kv_slot int32[1],
  block_tables
  int32[S, pages_per_seq], seq_lens int32[S], query_start_loc int32[S + 1], num_seqs int32[1])
  and the write arguments (new_k/new_v [T, num_kv_heads, head_dim], slot_mapping int32[T]).
  """
  _check_lengths(q_lens, kv_lens, num_seqs)
  if not 0 <= kv_slot < num_slots:
    raise ValueError(f"make_random_case: kv_slot={kv_slot} outside [0, {num_slots})")
  num_live_tokens = int(sum(q_lens))
  num_tokens = num_live_tokens + 1 if num_tokens is None else num_tokens
  if num_tokens < num_live_tokens:
    raise ValueError(f"make_random_case: num_tokens={num_tokens} < {num_live_tokens} live tokens")
  max_pages = max([_cdiv(kv_len, page_size) for kv_len in kv_lens] + [1])
  pages_per_seq = max_pages if pages_per_seq is None else pages_per_seq
  if pages_per_seq < max_pages:
    raise ValueError(f"make_random_case: pages_per_seq={pages_per_seq} < {max_pages} needed")
  num_pages = 1 + sum(_cdiv(kv_len, page_size) for kv_len in kv_lens) + num_pages_extra

  block_tables = _block_tables(
    rng, kv_lens, num_seqs, pages_per_seq, page_size, num_pages, shuffle_pages
  )
  seq_lens = np.zeros((num_seqs,), np.int32)
  seq_lens[: len(kv_lens)] = kv_lens
  query_start_loc = np.full((num_seqs + 1,), num_live_tokens, np.int32)
  query_start_loc[: len(q_lens) + 1] = np.concatenate([[0], np.cumsum(q_lens)])

  def normal(*shape: int) -> jnp.ndarray:
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype)

  kv_shape = (num_slots, num_kv_heads, num_pages, page_size, head_dim)
  return {
    "q": normal(num_tokens, num_q_heads, head_dim),
    "k_pool": normal(*kv_shape),
    "v_pool": normal(*kv_shape),
    "kv_slot": jnp.asarray([kv_slot], jnp.int32),
    "block_tables": jnp.asarray(block_tables),
    "seq_lens": jnp.asarray(seq_lens),
    "query_start_loc": jnp.asarray(query_start_loc),
    "num_seqs": jnp.asarray([len(q_lens)], jnp.int32),
    "new_k": normal(num_tokens, num_kv_heads, head_dim),
    "new_v": normal(num_tokens, num_kv_heads, head_dim),
    "slot_mapping": jnp.asarray(
      _slot_mapping(block_tables, q_lens, kv_lens, num_tokens, page_size)
    ),
  }


def attention_args(case: dict[str, jnp.ndarray]) -> tuple[jnp.ndarray, ...]:
  """The positional arguments of ragged_paged_attention(_reference), in order."""
  return tuple(case[name] for name in ATTENTION_ARG_NAMES)


def write_args(case: dict[str, jnp.ndarray]) -> tuple[jnp.ndarray, ...]:
  """The positional arguments of write_kv(_reference), in order."""
  return tuple(case[name] for name in WRITE_ARG_NAMES)


def quantize_pages(
  case: dict[str, jnp.ndarray], dtype: jnp.dtype, k_scale: float, v_scale: float
) -> dict[str, jnp.ndarray]:
  """`case` with its k_pool / v_pool stored as 8-bit `dtype` pages (kv_quant.py's format)."""
  return {
    **case,
    "k_pool": quantize_kv(case["k_pool"], dtype, k_scale),
    "v_pool": quantize_kv(case["v_pool"], dtype, v_scale),
  }


def single_slot(pages: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
  """One layer's pages [num_kv_heads, num_pages, page_size, head_dim] as a pool of one slot
  [1, ...] and its kv_slot int32[1] (0)."""
  return pages[None], jnp.zeros((1,), jnp.int32)


def assert_other_slots_unchanged(before: jnp.ndarray, after: jnp.ndarray, kv_slot: int) -> None:
  """Raises AssertionError unless every slot but kv_slot of the pools [num_slots, ...] is equal
  bit for bit."""

  def others(pool: jnp.ndarray) -> np.ndarray:
    return np.delete(np.asarray(pool.astype(jnp.float32)), kv_slot, axis=0)

  np.testing.assert_array_equal(others(after), others(before))
