"""The TPU ragged paged-attention and KV-write kernels, run in Pallas TPU interpret mode on CPU.

Interpret mode fills uninitialized VMEM with NaN, so stale or unfetched K/V buffer rows would show.
Kernel results are blocked on before anything else is dispatched: interpret mode runs JAX ops in
host callbacks, which can deadlock against concurrent eager dispatch on a 2-core CPU client.
Hand-computed cases pin the semantics; a fixed sample of the (head_dim, GQA ratio, page size,
dtype, window, soft-cap) sweep compares against the pure-jnp reference on scattered pages with
ragged lengths 0, 1, a full page, one past a page, decodes mixed with prefill chunks, and a chunk
that straddles two query blocks. Every configuration keeps the same array shapes for all its
cases, so each kernel variant is compiled once (interpret-mode compiles dominate the runtime).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ragged_paged_attention.reference import (
  ragged_paged_attention_reference,
  write_kv_reference,
)
from pallas_kernels.ragged_paged_attention.testing import (
  DEFAULT_KV_SLOT,
  assert_other_slots_unchanged,
  attention_args,
  make_random_case,
  write_args,
)
from pallas_kernels.ragged_paged_attention.tpu.attention import ragged_paged_attention, write_kv

NUM_TOKENS = 24  # two query blocks of 16 tokens
NUM_SEQ_SLOTS = 6
MAX_SEQ_LEN = 160  # two kv blocks of 128 tokens
QUERIES_PER_BLOCK = 16
SM_SCALE = 0.125


@dataclass(frozen=True)
class Config:
  head_dim: int
  num_kv_heads: int
  num_q_heads: int
  page_size: int
  dtype: jnp.dtype
  sliding_window: int | None = None
  soft_cap: float | None = None

  @property
  def pages_per_seq(self) -> int:
    return -(-MAX_SEQ_LEN // self.page_size)

  @property
  def num_pages(self) -> int:
    return NUM_SEQ_SLOTS * self.pages_per_seq + 2

  def attend(self, *args):
    return jax.block_until_ready(
      ragged_paged_attention(
        *args,
        sm_scale=SM_SCALE,
        sliding_window=self.sliding_window,
        soft_cap=self.soft_cap,
        num_queries_per_block=QUERIES_PER_BLOCK,
        num_kv_pages_per_block=128 // self.page_size,
        interpret=True,
      )
    )

  def reference(self, *args):
    return jax.block_until_ready(
      ragged_paged_attention_reference(
        *args, sm_scale=SM_SCALE, sliding_window=self.sliding_window, soft_cap=self.soft_cap
      )
    )


# Every head_dim, GQA ratio (1, 2, 4, 8, MQA with 6 heads), page size and dtype appears at least
# once.
SWEEP = (
  Config(64, 2, 2, 16, jnp.float32),
  Config(128, 2, 4, 32, jnp.bfloat16, sliding_window=20),
  Config(256, 1, 4, 64, jnp.float32, soft_cap=5.0),
  Config(128, 1, 8, 16, jnp.bfloat16, sliding_window=100, soft_cap=5.0),
  Config(64, 1, 6, 64, jnp.float32, sliding_window=37),
  Config(256, 2, 2, 32, jnp.bfloat16),
)


def _case(config: Config, q_lens, kv_lens, seed: int = 0):
  needed = sum(-(-kv_len // config.page_size) for kv_len in kv_lens)
  return make_random_case(
    np.random.default_rng(seed),
    num_seqs=NUM_SEQ_SLOTS,
    q_lens=q_lens,
    kv_lens=kv_lens,
    num_q_heads=config.num_q_heads,
    num_kv_heads=config.num_kv_heads,
    head_dim=config.head_dim,
    page_size=config.page_size,
    dtype=config.dtype,
    num_pages_extra=config.num_pages - 1 - needed,
    num_tokens=NUM_TOKENS,
    pages_per_seq=config.pages_per_seq,
  )


def _edge_lengths(page_size: int) -> tuple[list[int], list[int]]:
  """Decodes at lengths 1, a full page and one past a page; an idle slot; a prefill chunk on top
  of a long cached prefix; a fresh prefill that straddles the two query blocks."""
  return [1, 1, 1, 0, 12, 5], [1, page_size, page_size + 1, 9, MAX_SEQ_LEN - 20, 5]


def _random_lengths(seed: int) -> tuple[list[int], list[int]]:
  rng = np.random.default_rng(seed)
  num_live = int(rng.integers(1, NUM_SEQ_SLOTS + 1))
  budget = int(rng.integers(num_live, NUM_TOKENS + 1))
  q_lens = np.sort(rng.multinomial(budget - num_live, np.ones(num_live) / num_live) + 1)
  q_lens = [int(min(q, MAX_SEQ_LEN)) for q in q_lens]
  kv_lens = [int(rng.integers(q, MAX_SEQ_LEN + 1)) for q in q_lens]
  return q_lens, kv_lens


def _assert_close(out, expected, dtype) -> None:
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(
    np.asarray(out, np.float32), np.asarray(expected, np.float32), rtol=tol, atol=tol
  )


def _visible_mean(case, token: int, seq: int, position: int, window: int | None) -> np.ndarray:
  """Mean of V over the cache positions a token sees: the output when all scores are equal."""
  lo = 0 if window is None else max(0, position - window + 1)
  page_size = case["v_pool"].shape[3]
  positions = np.arange(lo, position + 1)
  pages = np.asarray(case["block_tables"])[seq, positions // page_size]
  v_pages = np.asarray(case["v_pool"], np.float32)[int(case["kv_slot"][0])]  # [KVH, P, ps, D]
  v = v_pages[:, pages, positions % page_size]  # [KVH, n, D]
  return v.mean(axis=1)


@pytest.mark.parametrize("config", [SWEEP[0], SWEEP[1]], ids=["f32", "bf16-window"])
def test_zero_queries_average_visible_values_by_hand(config):
  q_lens, kv_lens = _edge_lengths(config.page_size)
  case = _case(config, q_lens, kv_lens, seed=1)
  case["q"] = jnp.zeros_like(case["q"])
  out = np.asarray(config.attend(*attention_args(case)), np.float32)
  group = config.num_q_heads // config.num_kv_heads
  token = 0
  for seq, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens, strict=True)):
    for j in range(q_len):
      expected = _visible_mean(case, token, seq, kv_len - q_len + j, config.sliding_window)
      _assert_close(out[token], np.repeat(expected, group, axis=0), config.dtype)
      token += 1
  np.testing.assert_array_equal(out[token:], 0.0)  # padding tokens


def test_decode_over_two_positions_by_hand():
  # scores (0, ln 4) / SM_SCALE-scaled -> probs (1/5, 4/5); values 10 and 5 -> 2 + 4 = 6.
  config = SWEEP[0]
  case = _case(config, [1], [2], seed=2)
  page = int(case["block_tables"][0, 0])
  head_dim = config.head_dim
  q = np.zeros(case["q"].shape, np.float32)
  q[0, :, 0] = 1.0 / SM_SCALE
  k_pool = np.asarray(case["k_pool"]).copy()
  v_pool = np.asarray(case["v_pool"]).copy()
  k_pages, v_pages = k_pool[DEFAULT_KV_SLOT], v_pool[DEFAULT_KV_SLOT]  # views of the read slot
  k_pages[:, page, :2] = 0.0
  k_pages[:, page, 1, 0] = math.log(4.0)
  v_pages[:, page, :2] = 0.0
  v_pages[:, page, 0, 3], v_pages[:, page, 1, 3] = 10.0, 5.0
  case.update(q=jnp.asarray(q), k_pool=jnp.asarray(k_pool), v_pool=jnp.asarray(v_pool))
  out = np.asarray(config.attend(*attention_args(case)))
  expected = np.zeros((config.num_q_heads, head_dim), np.float32)
  expected[:, 3] = 6.0
  np.testing.assert_allclose(out[0], expected, atol=1e-5)
  np.testing.assert_array_equal(out[1:], 0.0)


@pytest.mark.parametrize(
  "config",
  SWEEP,
  ids=lambda c: (
    f"d{c.head_dim}-kv{c.num_kv_heads}-q{c.num_q_heads}-p{c.page_size}-"
    f"{jnp.dtype(c.dtype).name}-w{c.sliding_window}-cap{c.soft_cap}"
  ),
)
def test_matches_reference(config):
  random_seed = config.head_dim + config.num_q_heads + config.page_size
  for seed, (q_lens, kv_lens) in enumerate(
    [_edge_lengths(config.page_size), _random_lengths(random_seed)]
  ):
    args = attention_args(_case(config, q_lens, kv_lens, seed=seed))
    _assert_close(config.attend(*args), config.reference(*args), config.dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_write_kv_matches_reference(dtype):
  config = Config(64, 2, 2, 16, dtype)
  # Prefill runs share 16-row chunks, decodes hit scattered pages, 3 padding tokens -> page 0.
  case = _case(config, [1, 1, 0, 13, 6], [1, 17, 4, 40, 6], seed=3)
  slots = np.asarray(case["slot_mapping"]).copy()
  slots[-1] = config.num_pages * config.page_size + 5  # out of range: dropped
  case["slot_mapping"] = jnp.asarray(slots)
  got = jax.block_until_ready(write_kv(*write_args(case), num_tokens_per_block=8, interpret=True))
  expected = write_kv_reference(*write_args(case))
  for got_pages, expected_pages, before in zip(
    got, expected, (case["k_pool"], case["v_pool"]), strict=True
  ):
    np.testing.assert_array_equal(
      np.asarray(got_pages, np.float32), np.asarray(expected_pages, np.float32)
    )
    assert_other_slots_unchanged(before, got_pages, DEFAULT_KV_SLOT)


def _valid_args(config: Config = SWEEP[0]):
  return attention_args(_case(config, [1], [1]))


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(num_kv_pages_per_block=4), "num_kv_pages_per_block"),  # 4 x 16 = 64 tokens
    (dict(num_kv_pages_per_block=0), "num_kv_pages_per_block"),
    (dict(num_queries_per_block=4), "num_queries_per_block"),  # 4 x 1 rows < 8
    (dict(sliding_window=0), "sliding_window"),
    (dict(soft_cap=-1.0), "soft_cap"),
  ],
)
def test_bad_block_sizes_and_options_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ragged_paged_attention(
      *_valid_args(Config(64, 2, 2, 16, jnp.float32)), sm_scale=1.0, interpret=True, **kwargs
    )


def test_bad_shapes_raise():
  args = _valid_args()
  k_pool = args[1]
  bad = [
    ({0: args[0][..., :32], 1: k_pool[..., :32], 2: k_pool[..., :32]}, "head_dim"),
    ({1: k_pool[:, :, :, :8], 2: k_pool[:, :, :, :8]}, "page_size"),
    ({5: args[5][:-1]}, "seq_lens"),
    ({0: args[0][:, :1]}, "num_q_heads"),
    ({1: k_pool[0], 2: k_pool[0]}, "k_pool"),  # one layer's 4-D pages, not the 5-D pool
    ({3: args[3][0]}, "kv_slot"),  # a 0-d slot, not int32[1]
  ]
  for changes, match in bad:
    changed = [changes.get(i, arg) for i, arg in enumerate(args)]
    with pytest.raises(ValueError, match=match):
      ragged_paged_attention(*changed, sm_scale=1.0, interpret=True)


def test_write_kv_bad_inputs_raise():
  k_pool, v_pool, kv_slot, new_k, new_v, slot_mapping = write_args(_case(SWEEP[0], [1], [1]))
  with pytest.raises(ValueError, match="new_k"):
    write_kv(k_pool, v_pool, kv_slot, new_k[..., :32], new_v, slot_mapping, interpret=True)
  with pytest.raises(ValueError, match="page_size"):
    bf16_pool = k_pool[:, :, :, :8].astype(jnp.bfloat16)
    write_kv(bf16_pool, bf16_pool, kv_slot, new_k, new_v, slot_mapping, interpret=True)
  with pytest.raises(ValueError, match="kv_slot"):
    write_kv(k_pool, v_pool, kv_slot[0], new_k, new_v, slot_mapping, interpret=True)
  with pytest.raises(ValueError, match="num_tokens_per_block"):
    write_kv(
      k_pool, v_pool, kv_slot, new_k, new_v, slot_mapping, num_tokens_per_block=0, interpret=True
    )
