"""The GPU ragged paged-attention and KV-write kernels: interpret mode on CPU, compiled on a GPU.

Hand-computed cases pin the semantics; a seeded sweep compares against the pure-jnp reference
over head dims, GQA ratios, page sizes, dtypes, window / soft-cap and ragged lengths (0, 1, a
full page, one past a page, mixed decode + prefill) on scattered pages.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ragged_paged_attention.gpu.attention import ragged_paged_attention, write_kv
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

HEAD_DIM = 64
INTERPRET = jax.default_backend() != "gpu"  # on a GPU the same tests run the compiled kernels


def _single_seq_inputs(
  keys: np.ndarray, values: np.ndarray, queries: np.ndarray, page_size: int = 16
):
  """One sequence whose cache holds `keys`/`values` [L, D] on page 2 of slot 1 (of 3 slots);
  queries [Q, D] are last."""
  seq_len, head_dim = keys.shape
  k_pool = np.full((3, 1, 4, page_size, head_dim), 50.0, np.float32)  # junk everywhere else
  v_pool = np.full((3, 1, 4, page_size, head_dim), 50.0, np.float32)
  k_pool[1, 0, 2, :seq_len] = keys
  v_pool[1, 0, 2, :seq_len] = values
  num_q = queries.shape[0]
  return (
    jnp.asarray(queries[:, None, :]),
    jnp.asarray(k_pool),
    jnp.asarray(v_pool),
    jnp.asarray([1], jnp.int32),
    jnp.asarray([[2]], jnp.int32),
    jnp.asarray([seq_len], jnp.int32),
    jnp.asarray([0, num_q], jnp.int32),
    jnp.asarray([1], jnp.int32),
  )


def _unit(dim: int, scale: float = 1.0) -> np.ndarray:
  vec = np.zeros((HEAD_DIM,), np.float32)
  vec[dim] = scale
  return vec


def test_decode_token_over_two_positions_by_hand():
  # scores (0, ln 3) -> probs (1/4, 3/4); values 4 and 8 on dim 1 -> 1 + 6 = 7.
  keys = np.stack([_unit(0, 0.0), _unit(0, math.log(3.0))])
  values = np.stack([_unit(1, 4.0), _unit(1, 8.0)])
  args = _single_seq_inputs(keys, values, _unit(0)[None])
  out = ragged_paged_attention(*args, sm_scale=1.0, interpret=INTERPRET)
  np.testing.assert_allclose(np.asarray(out[0, 0]), _unit(1, 7.0), atol=1e-5)


def test_sliding_window_by_hand():
  # Position 2 with window 2 sees positions 1 and 2 only: equal scores -> mean(10, 20) = 15.
  keys = np.zeros((3, HEAD_DIM), np.float32)
  values = np.stack([_unit(3, 1000.0), _unit(3, 10.0), _unit(3, 20.0)])
  args = _single_seq_inputs(keys, values, _unit(0)[None])
  out = ragged_paged_attention(*args, sm_scale=1.0, sliding_window=2, interpret=INTERPRET)
  np.testing.assert_allclose(np.asarray(out[0, 0]), _unit(3, 15.0), atol=1e-4)


def test_soft_cap_by_hand():
  # Raw scores (10, 0) capped at 2: 2 * tanh(5) and 0.
  keys = np.stack([_unit(0, 10.0), _unit(0, 0.0)])
  values = np.stack([_unit(1, 1.0), _unit(1, 0.0)])
  args = _single_seq_inputs(keys, values, _unit(0)[None])
  out = ragged_paged_attention(*args, sm_scale=1.0, soft_cap=2.0, interpret=INTERPRET)
  capped = math.exp(2.0 * math.tanh(5.0))
  np.testing.assert_allclose(np.asarray(out[0, 0]), _unit(1, capped / (capped + 1.0)), atol=1e-5)


def test_prefill_is_causal_by_hand():
  # Two prefill tokens, equal scores: token 0 sees only v0 = 2, token 1 averages 2 and 6.
  keys = np.zeros((2, HEAD_DIM), np.float32)
  values = np.stack([_unit(5, 2.0), _unit(5, 6.0)])
  args = _single_seq_inputs(keys, values, np.stack([_unit(0), _unit(0)]))
  out = ragged_paged_attention(*args, sm_scale=1.0, interpret=INTERPRET)
  np.testing.assert_allclose(
    np.asarray(out[:, 0]), np.stack([_unit(5, 2.0), _unit(5, 4.0)]), atol=1e-5
  )


# (q_heads, kv_heads, head_dim, page_size, dtype, q_lens, kv_lens, window, soft_cap, blocks)
SWEEP = [
  (4, 4, 64, 16, "float32", [1, 1, 0, 1], [1, 16, 5, 17], None, None, {}),
  (8, 4, 128, 32, "float32", [5, 1, 33], [37, 32, 33], None, None, {}),
  (8, 2, 64, 64, "bfloat16", [1, 0, 64, 1], [65, 0, 64, 130], None, None, {}),
  (8, 1, 256, 16, "bfloat16", [17, 1], [40, 16], 7, None, {}),
  (16, 2, 64, 32, "float32", [3, 1, 20], [3, 33, 50], None, 5.0, {}),
  (6, 2, 128, 16, "float32", [1, 9], [31, 20], 12, 30.0, {}),
  (4, 1, 64, 64, "float32", [30, 1], [100, 64], 40, None, {"block_kv": 16}),
  (8, 8, 128, 16, "bfloat16", [40, 0, 1], [47, 1, 2], None, None, {"block_q": 32, "block_kv": 32}),
  (32, 2, 64, 16, "float32", [2, 1, 1, 1], [18, 1, 16, 17], None, None, {}),
  (
    8,
    2,
    128,
    16,
    "float32",
    [1, 1, 0, 1],
    [100, 1, 3, 33],
    None,
    None,
    {"num_kv_splits": 3, "block_kv": 16},
  ),
  (4, 1, 64, 32, "bfloat16", [1, 4, 1], [90, 70, 2], 30, 8.0, {"num_kv_splits": 4, "block_kv": 16}),
]


@pytest.mark.parametrize("case_id", range(len(SWEEP)))
def test_matches_reference(case_id: int):
  (
    num_q_heads,
    num_kv_heads,
    head_dim,
    page_size,
    dtype,
    q_lens,
    kv_lens,
    window,
    soft_cap,
    blocks,
  ) = SWEEP[case_id]
  rng = np.random.default_rng(case_id)
  case = make_random_case(
    rng,
    num_seqs=len(q_lens) + 1,
    q_lens=q_lens,
    kv_lens=kv_lens,
    num_q_heads=num_q_heads,
    num_kv_heads=num_kv_heads,
    head_dim=head_dim,
    page_size=page_size,
    dtype=jnp.dtype(dtype),
    num_tokens=sum(q_lens) + 3,
  )
  kwargs = dict(sm_scale=head_dim**-0.5, sliding_window=window, soft_cap=soft_cap)
  with jax.default_matmul_precision("highest"):  # no TF32 in the float32 reference on GPUs
    expected = jax.jit(functools.partial(ragged_paged_attention_reference, **kwargs))(
      *attention_args(case)
    )
  actual = ragged_paged_attention(*attention_args(case), **kwargs, **blocks, interpret=INTERPRET)
  assert actual.shape == expected.shape and actual.dtype == expected.dtype
  expected = np.asarray(expected, np.float32)
  actual = np.asarray(actual, np.float32)
  if dtype == "float32":
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)
  else:
    np.testing.assert_allclose(actual, expected, atol=2e-2, rtol=2e-2)
  np.testing.assert_array_equal(actual[sum(q_lens) :], 0.0)


def test_padding_sequence_slots_with_queries_are_ignored():
  # Padding slots whose query_start_loc runs on to T must not write anything.
  rng = np.random.default_rng(7)
  case = make_random_case(
    rng,
    num_seqs=4,
    q_lens=[2, 1],
    kv_lens=[9, 20],
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=64,
    page_size=16,
    num_tokens=8,
  )
  case["query_start_loc"] = jnp.asarray([0, 2, 3, 6, 8], jnp.int32)
  case["seq_lens"] = jnp.asarray([9, 20, 5, 7], jnp.int32)
  with jax.default_matmul_precision("highest"):
    expected = jax.jit(functools.partial(ragged_paged_attention_reference, sm_scale=0.125))(
      *attention_args(case)
    )
  actual = ragged_paged_attention(*attention_args(case), sm_scale=0.125, interpret=INTERPRET)
  np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(actual[3:]), 0.0)


@pytest.mark.parametrize("head_dim,page_size,dtype", [(64, 16, "float32"), (128, 64, "bfloat16")])
def test_write_kv_matches_reference(head_dim: int, page_size: int, dtype: str):
  rng = np.random.default_rng(head_dim)
  case = make_random_case(
    rng,
    num_seqs=3,
    q_lens=[1, 20, 3],
    kv_lens=[17, 20, 64],
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=head_dim,
    page_size=page_size,
    dtype=jnp.dtype(dtype),
    num_tokens=29,
  )
  slots = np.asarray(case["slot_mapping"]).copy()
  slots[-1] = case["k_pool"].shape[2] * page_size + 3  # out of range: dropped
  case["slot_mapping"] = jnp.asarray(slots)
  expected = jax.jit(write_kv_reference)(*write_args(case))
  actual = write_kv(*write_args(case), interpret=INTERPRET)
  for got, want, before in zip(actual, expected, (case["k_pool"], case["v_pool"]), strict=True):
    # Page 0 receives the padding tokens in an unspecified order; every other page must match.
    np.testing.assert_array_equal(np.asarray(got[:, :, 1:]), np.asarray(want[:, :, 1:]))
    slot = DEFAULT_KV_SLOT
    assert not np.array_equal(np.asarray(got[slot, :, 1:]), np.asarray(before[slot, :, 1:]))
    assert_other_slots_unchanged(before, got, slot)


def _valid_case(**overrides):
  rng = np.random.default_rng(0)
  params = dict(
    num_seqs=2,
    q_lens=[1, 2],
    kv_lens=[3, 4],
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=64,
    page_size=16,
  )
  params.update(overrides)
  return make_random_case(rng, **params)


@pytest.mark.parametrize(
  "overrides,kwargs,match",
  [
    ({"head_dim": 96}, {}, "head_dim"),
    ({"page_size": 8}, {}, "page_size"),
    ({"page_size": 128}, {}, "page_size"),
    ({}, {"block_kv": 48}, "block_kv"),
    ({}, {"block_kv": 8}, "block_kv"),
    ({}, {"block_q": 3}, "block_q"),
    ({}, {"block_q": 2}, "block_q"),  # 2 tokens x 2 heads = 4 rows < 16
    ({}, {"block_q": 128}, "block_q"),  # 256 rows > 128
    ({}, {"sliding_window": 0}, "sliding_window"),
    ({}, {"num_kv_splits": 0}, "num_kv_splits"),
  ],
)
def test_attention_rejects_bad_inputs(overrides, kwargs, match):
  case = _valid_case(**overrides)
  with pytest.raises(ValueError, match=match):
    ragged_paged_attention(*attention_args(case), sm_scale=0.1, interpret=INTERPRET, **kwargs)


def test_attention_rejects_bad_shapes():
  case = _valid_case()
  with pytest.raises(ValueError, match="q"):
    ragged_paged_attention(case["q"][0], *attention_args(case)[1:], sm_scale=0.1)
  with pytest.raises(ValueError, match="seq_lens"):
    args = list(attention_args(case))
    args[5] = args[5][:1]
    ragged_paged_attention(*args, sm_scale=0.1)
  for index, bad, match in (
    (1, case["k_pool"][0], "k_pool"),  # one layer's 4-D pages, not the 5-D pool
    (2, case["v_pool"][:1], "v_pool"),
    (3, case["kv_slot"][0], "kv_slot"),  # a 0-d slot, not int32[1]
    (3, case["kv_slot"].astype(jnp.float32), "kv_slot"),
  ):
    args = list(attention_args(case))
    args[index] = bad
    with pytest.raises(ValueError, match=match):
      ragged_paged_attention(*args, sm_scale=0.1)


def test_write_kv_rejects_bad_inputs():
  case = _valid_case()
  with pytest.raises(ValueError, match="new_k"):
    write_kv(*write_args({**case, "new_k": case["new_k"][:, :1]}), interpret=INTERPRET)
  with pytest.raises(ValueError, match="k_pool"):
    write_kv(*write_args({**case, "k_pool": case["k_pool"][0]}), interpret=INTERPRET)
  with pytest.raises(ValueError, match="kv_slot"):
    write_kv(*write_args({**case, "kv_slot": case["kv_slot"][0]}), interpret=INTERPRET)
  with pytest.raises(ValueError, match="block_tokens"):
    write_kv(*write_args(case), block_tokens=12, interpret=INTERPRET)


@pytest.mark.parametrize(
  "head_dim, itemsize, stages", [(128, 1, 3), (128, 2, 2), (256, 1, 2), (64, 1, 3)]
)
def test_default_stages_follow_the_page_dtype(head_dim: int, itemsize: int, stages: int):
  """8-bit pages get 3 stages (two K/V tiles in flight, the page ids prefetched a tile ahead);
  16-bit pages and head_dim 256 get 2, which keeps one tile in flight and 3 programs an SM."""
  from pallas_kernels.ragged_paged_attention.gpu.tiling import choose_tiling

  tiling = choose_tiling(512, 512, 32, 8, head_dim, max_kv_len=2048, page_itemsize=itemsize)
  assert tiling.num_stages == stages
  assert (
    choose_tiling(
      512, 512, 32, 8, head_dim, max_kv_len=2048, page_itemsize=itemsize, num_stages=5
    ).num_stages
    == 5
  )
