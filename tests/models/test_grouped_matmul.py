"""The grouped matmul and the expert FFN of models/grouped_matmul.py against dense numpy
references: randomized group sizes, empty groups (more experts than assignments), and the
expert-parallel split into shards whose partials add up to the whole; through ragged_dot (the
CPU's "auto"), through the routing kernel and the routed Pallas products ("pallas", CUDA's
"auto") and through the Pallas products on XLA-sorted rows ("pallas_sorted"), interpret mode on
CPU, and the kernel choice."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models.grouped_matmul import (
  expert_ffn,
  grouped_matmul,
  grouped_swiglu,
  sort_by_expert,
)


def _silu(x: np.ndarray) -> np.ndarray:
  return x / (1.0 + np.exp(-x))


def _reference_ffn(x, ids, weights, gate, up, down) -> np.ndarray:
  """Token by token, assignment by assignment, in float64."""
  x, gate, up, down = (np.asarray(a, np.float64) for a in (x, gate, up, down))
  out = np.zeros_like(x)
  for t in range(x.shape[0]):
    for k in range(ids.shape[1]):
      e = ids[t, k]
      out[t] += weights[t, k] * ((_silu(x[t] @ gate[e]) * (x[t] @ up[e])) @ down[e])
  return out


def _random_case(rng, num_tokens, top_k, num_experts, hidden=16, inner=8):  # inner 8: ragged
  x = rng.standard_normal((num_tokens, hidden)).astype(np.float32)
  ids = np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(num_tokens)])
  weights = rng.random((num_tokens, top_k)).astype(np.float32)
  gate, up = (rng.standard_normal((num_experts, hidden, inner)).astype(np.float32) for _ in "gu")
  down = rng.standard_normal((num_experts, inner, hidden)).astype(np.float32) / inner**0.5
  return x, ids.astype(np.int32), weights, gate, up, down


@pytest.mark.parametrize("seed", range(4))
def test_grouped_matmul_matches_per_group_numpy(seed):
  rng = np.random.default_rng(seed)
  num_groups, num_rows = int(rng.integers(1, 9)), int(rng.integers(1, 40))
  cuts = np.sort(rng.integers(0, num_rows + 1, num_groups - 1))  # repeated cuts: empty groups
  sizes = np.diff(np.concatenate([[0], cuts, [num_rows]])).astype(np.int32)
  rows = rng.standard_normal((num_rows, 12)).astype(np.float32)
  weights = rng.standard_normal((num_groups, 12, 5)).astype(np.float32)
  got = np.asarray(jax.jit(grouped_matmul)(rows, weights, sizes))
  ends = np.cumsum(sizes)
  want = np.concatenate(
    [rows[end - n : end] @ weights[g] for g, (n, end) in enumerate(zip(sizes, ends, strict=True))]
  )
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_empty_groups_and_unused_rows():
  rows = np.arange(24, dtype=np.float32).reshape(6, 4) / 10
  weights = np.stack([np.eye(4, 3, dtype=np.float32) * (g + 1) for g in range(4)])  # [4, 4, 3]
  got = np.asarray(grouped_matmul(rows, weights, np.array([0, 2, 0, 3], np.int32)))
  np.testing.assert_allclose(got[:2], rows[:2, :3] * 2, rtol=1e-6)
  np.testing.assert_allclose(got[2:5], rows[2:5, :3] * 4, rtol=1e-6)


def test_sort_by_expert_groups_local_assignments_first():
  ids = np.array([[3, 1], [0, 3], [2, 5]], np.int32)  # flat: 3 1 0 3 2 5
  order, local, sizes = (np.asarray(a) for a in sort_by_expert(jnp.asarray(ids), 3, 1))
  # local experts 1, 2, 3 (ids 0..2): flat 1 -> 0, 4 -> 1, 0 and 3 -> 2; then 2 (expert 0), 5
  assert order.tolist() == [1, 4, 0, 3, 2, 5]
  assert local.tolist() == [True, True, False, True, True, False]
  assert sizes.tolist() == [1, 1, 2]


@pytest.mark.parametrize(
  "num_tokens,top_k,num_experts",
  [(1, 2, 8), (3, 2, 16), (13, 4, 8), (32, 1, 4), (5, 8, 64)],  # several leave experts empty
)
def test_expert_ffn_matches_dense_reference(num_tokens, top_k, num_experts):
  rng = np.random.default_rng(num_tokens * 100 + num_experts)
  case = _random_case(rng, num_tokens, top_k, num_experts)
  got = np.asarray(jax.jit(expert_ffn)(*case))
  assert got.dtype == np.float32
  np.testing.assert_allclose(got, _reference_ffn(*case), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_shards", [2, 4])
def test_expert_shards_partials_sum_to_the_whole(num_shards):
  x, ids, weights, gate, up, down = _random_case(np.random.default_rng(7), 11, 2, 8)
  per = 8 // num_shards
  partials = [
    expert_ffn(x, ids, weights, *(w[s * per : (s + 1) * per] for w in (gate, up, down)), s * per)
    for s in range(num_shards)
  ]
  whole = _reference_ffn(x, ids, weights, gate, up, down)
  np.testing.assert_allclose(np.asarray(sum(partials)), whole, rtol=1e-4, atol=1e-4)


def test_shapes_are_validated():
  x, ids, weights, gate, up, down = _random_case(np.random.default_rng(0), 4, 2, 4)
  with pytest.raises(ValueError, match="x/weights"):
    expert_ffn(x[:3], ids, weights, gate, up, down)
  with pytest.raises(ValueError, match="up/down"):
    expert_ffn(x, ids, weights, gate, up, down[:, :4])
  with pytest.raises(ValueError, match="group_sizes"):
    grouped_matmul(x, gate, np.array([4], np.int32))


PALLAS_CASES = [(1, 2, 8), (5, 8, 64), (13, 4, 8)]


@pytest.mark.parametrize("kernel", ["pallas", "pallas_sorted"])
@pytest.mark.parametrize("num_tokens,top_k,num_experts", PALLAS_CASES)
def test_expert_ffn_through_the_pallas_kernel_matches_dense_reference(
  num_tokens, top_k, num_experts, kernel
):
  """hidden 32 and inner 16: sizes the kernel takes (K and N multiples of 16); "pallas" through
  the routing kernel and the gathered/scattered products, "pallas_sorted" through XLA's sort."""
  rng = np.random.default_rng(num_tokens * 100 + num_experts)
  case = _random_case(rng, num_tokens, top_k, num_experts, hidden=32, inner=16)
  got = np.asarray(jax.jit(functools.partial(expert_ffn, kernel=kernel))(*case))
  np.testing.assert_allclose(got, _reference_ffn(*case), rtol=1e-4, atol=1e-4)


def test_expert_ffn_with_every_token_on_one_expert():
  x, ids, weights, gate, up, down = _random_case(np.random.default_rng(1), 7, 1, 4, 32, 16)
  ids = np.full_like(ids, 2)
  got = expert_ffn(x, ids, weights, gate, up, down, kernel="pallas")
  want = _reference_ffn(x, ids, weights, gate, up, down)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", ["pallas", "pallas_sorted"])
def test_expert_shards_through_the_pallas_kernel_sum_to_the_whole(kernel):
  """Shards of 2 experts (first_expert 0, 2, 4, 6): each adds exactly zero for the assignments
  to the others' experts."""
  x, ids, weights, gate, up, down = _random_case(np.random.default_rng(3), 9, 2, 8, 32, 16)
  partials = [
    expert_ffn(
      x, ids, weights, *(w[s * 2 : (s + 1) * 2] for w in (gate, up, down)), s * 2, kernel=kernel
    )
    for s in range(4)
  ]
  whole = _reference_ffn(x, ids, weights, gate, up, down)
  np.testing.assert_allclose(np.asarray(sum(partials)), whole, rtol=1e-4, atol=1e-4)
  ids_of = [set(range(s * 2, s * 2 + 2)) for s in range(4)]
  for s, partial in enumerate(partials):  # tokens routed to none of shard s's experts: zero
    idle = [t for t in range(9) if not ids_of[s] & set(ids[t].tolist())]
    assert not np.asarray(partial)[idle].any()


def test_the_kernels_agree_on_the_grouped_rows():
  """grouped_matmul and grouped_swiglu, kernel "pallas" against "ragged_dot" (CPU's "auto")."""
  rng = np.random.default_rng(5)
  rows = rng.standard_normal((21, 32)).astype(np.float32)
  gate, up = (rng.standard_normal((4, 32, 16)).astype(np.float32) for _ in "gu")
  sizes = np.array([5, 0, 11, 3], np.int32)  # 2 rows past the groups
  for kernel_fn, args in ((grouped_matmul, (gate,)), (grouped_swiglu, (gate, up))):
    pallas, ragged, auto = (
      np.asarray(kernel_fn(rows, *args, sizes, kernel))
      for kernel in ("pallas", "ragged_dot", "auto")
    )
    np.testing.assert_allclose(pallas[:19], ragged[:19], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(auto, ragged)
    assert not pallas[19:].any()


def test_a_bad_kernel_name_is_refused():
  rows, weights = np.zeros((4, 16), np.float32), np.zeros((2, 16, 16), np.float32)
  with pytest.raises(ValueError, match="kernel: expected one of"):
    grouped_matmul(rows, weights, np.array([2, 2], np.int32), "triton")
