"""The MoE routing kernel (pallas_kernels/grouped_matmul/routing.py) and the routed grouped
matmuls (routed.py: rows gathered by token, outputs scattered to their assignments, weighted)
against hand-computed values and their pure-jnp references: experts with no assignment, every
assignment on one expert, first_expert != 0 with assignments to other devices' experts, chunk
and tile-chunk boundaries; shape checks; lowering for CUDA. Compiled on a GPU, in Pallas
interpret mode elsewhere."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.grouped_matmul.gpu import Tiling
from pallas_kernels.grouped_matmul.reference import (
  grouped_matmul_scattered_reference,
  grouped_swiglu_gathered_reference,
  route_assignments_reference,
)
from pallas_kernels.grouped_matmul.routed import (
  grouped_matmul_scattered,
  grouped_swiglu_gathered,
  routed_swiglu_ffn,
)
from pallas_kernels.grouped_matmul.routing import BLOCK, SERIAL_CHUNKS, route_assignments
from pallas_kernels.grouped_matmul.tiles import default_block_m, fit_stages
from tests.pallas_kernels.test_gpu_lowering import _custom_call_targets, _lower_for_cuda

INTERPRET = jax.default_backend() != "gpu"
SMALL = Tiling(block_m=16, block_n=16, block_k=16)


def _silu(x):
  return x / (1.0 + np.exp(-x))


def _lists(routing):
  return [np.asarray(a).tolist() for a in routing.arrays()]


def test_routing_hand_computed():
  """Tokens 0-2, top 2, flat ids 3 1 | 0 3 | 2 5; local experts 1, 2, 3 (first_expert 1):
  expert 1 <- a1, expert 2 <- a4, expert 3 <- a0, a3 (in that order), then a2 and a5 (experts 0
  and 5: another device's). Tiles of 16: one per expert and the tail's."""
  ids = jnp.array([[3, 1], [0, 3], [2, 5]], jnp.int32)
  got = _lists(route_assignments(ids, 3, 16, 1, interpret=INTERPRET))
  assert got == [
    [1, 4, 0, 3, 2, 5],  # order
    [1, 1, 2],  # group sizes
    [0, 1, 2, 3],  # tile groups (3: the tail)
    [0, 1, 2, 4],  # tile starts
    [1, 1, 2, 2],  # tile rows
  ]
  assert got == _lists(route_assignments_reference(ids, 3, 16, 1))


def _random_ids(rng, tokens, top_k, num_ids, kind):
  if kind == "one_expert":
    return np.full((tokens, top_k), num_ids // 2, np.int32)
  ids = [rng.choice(num_ids, top_k, replace=False) for _ in range(tokens)]
  return np.asarray(ids, np.int32)


ROUTING_CASES = [  # tokens, top_k, num_local, first, num_ids, block_m, kind
  (1, 8, 128, 0, 128, 16, "random"),  # decode: 8 rows among 128 experts, most empty
  (5, 2, 4, 0, 4, 16, "one_expert"),  # every assignment on expert 2
  (37, 4, 8, 8, 32, 16, "random"),  # first_expert 8: experts 8-15 of 32
  (70, 2, 6, 3, 12, 32, "random"),  # 140 assignments: past one chunk of 128
  (300, 8, 64, 64, 128, 64, "random"),  # 2400 assignments (19 chunks), half another's
  (300, 4, 16, 0, 16, 16, "random"),  # 90 tiles: past one chunk of 64 tiles
  (9, 3, 5, 7, 12, 16, "one_expert"),  # every assignment on expert 6: none local
]


def _routing_params():
  """Each case in the two-kernel form, and in the default form where it differs (up to
  SERIAL_CHUNKS chunks of assignments: past them the default is the two-kernel form)."""
  for case in ROUTING_CASES:
    yield pytest.param(*case, 0, id=f"parallel-{case[0]}x{case[1]}-{case[6]}")
    if case[0] * case[1] <= SERIAL_CHUNKS * BLOCK:
      yield pytest.param(*case, SERIAL_CHUNKS, id=f"default-{case[0]}x{case[1]}-{case[6]}")


@pytest.mark.parametrize(
  "tokens,top_k,num_local,first,num_ids,block_m,kind,max_serial_chunks", list(_routing_params())
)
def test_routing_random_sweep_against_reference(
  tokens, top_k, num_local, first, num_ids, block_m, kind, max_serial_chunks
):
  """Each case through the two-kernel form (counts, then placement: every size) and the default
  (one program up to SERIAL_CHUNKS chunks of assignments, the two kernels past that)."""
  rng = np.random.default_rng(tokens * 7 + num_local)
  ids = jnp.asarray(_random_ids(rng, tokens, top_k, num_ids, kind))
  got = route_assignments(
    ids, num_local, block_m, first, max_serial_chunks=max_serial_chunks, interpret=INTERPRET
  )
  want = route_assignments_reference(ids, num_local, block_m, first)
  names = ("order", "group_sizes", "tile_group", "tile_start", "tile_rows")
  for name, g, w in zip(names, got.arrays(), want.arrays(), strict=True):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=name)
  assert got.block_m == block_m
  assert sorted(np.asarray(got.order).tolist()) == list(range(tokens * top_k))


def test_routing_takes_a_traced_first_expert():
  """Expert parallelism passes axis_index * E_local, a traced scalar."""
  ids = jnp.array([[0, 5], [6, 1], [4, 7]], jnp.int32)
  run = jax.jit(lambda ids, first: route_assignments(ids, 4, 16, first, interpret=INTERPRET))
  for first in (0, 4):
    assert _lists(run(ids, jnp.int32(first))) == _lists(
      route_assignments_reference(ids, 4, 16, first)
    )


@pytest.mark.parametrize(
  "args,field",
  [
    ((jnp.zeros((4,), jnp.int32), 4, 16), "expert_ids: expected int"),
    ((jnp.zeros((4, 2), jnp.float32), 4, 16), "expert_ids: expected int"),
    ((jnp.zeros((4, 2), jnp.int32), 0, 16), "num_local: expected 1.."),
    ((jnp.zeros((4, 2), jnp.int32), 4, 24), "block_m: expected a power of two"),
    ((jnp.zeros((4, 2), jnp.int32), 4, 16, jnp.zeros((2,), jnp.int32)), "first_expert"),
  ],
)
def test_routing_bad_arguments_raise_value_errors(args, field):
  with pytest.raises(ValueError, match="route_assignments: " + field):
    route_assignments(*args, interpret=True)


def test_routed_products_hand_computed():
  """Two tokens, top 2, this device's experts 0 and 1: token 0 -> experts 0 (weight 0.25) and 1
  (0.5), token 1 -> expert 5 (another device's; 0.75) and 0 (1.0). gate = I, up = c * I (c = 1
  and 3), down = I: assignment a of token t on expert e is w_a * silu(x_t) * c_e * x_t, and the
  assignment to expert 5 is 0."""
  x = np.zeros((2, 16), np.float32)
  x[0, 0], x[1, 1] = 1.0, 2.0
  eye = np.eye(16, dtype=np.float32)
  gate, up = np.stack([eye, eye]), np.stack([eye, 3 * eye])
  routing = route_assignments(jnp.array([[0, 1], [5, 0]]), 2, 16, 0, interpret=INTERPRET)
  assert np.asarray(routing.order).tolist() == [0, 3, 1, 2]  # expert 0: a0, a3; 1: a1; a2
  hidden = grouped_swiglu_gathered(x, gate, up, routing, 2, tiling=SMALL, interpret=INTERPRET)
  expected = np.zeros((4, 16), np.float32)  # sorted rows
  expected[0, 0], expected[1, 1], expected[2, 0] = _silu(1.0), _silu(2.0) * 2, _silu(1.0) * 3
  np.testing.assert_allclose(np.asarray(hidden), expected, rtol=1e-6)
  route_w = jnp.array([0.25, 0.5, 0.75, 1.0], jnp.float32)
  down = np.stack([eye, eye])
  out = grouped_matmul_scattered(hidden, down, routing, route_w, tiling=SMALL, interpret=INTERPRET)
  expected = np.zeros((4, 16), np.float32)  # assignment order; a2 stays zero
  expected[0, 0] = 0.25 * _silu(1.0)
  expected[1, 0] = 0.5 * _silu(1.0) * 3
  expected[3, 1] = 1.0 * _silu(2.0) * 2
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)


@pytest.mark.parametrize(
  "tokens,top_k,num_local,first,num_ids,hidden,inner,dtype,tiling,kind",
  [
    (1, 8, 16, 0, 16, 32, 16, jnp.float32, SMALL, "random"),
    (13, 2, 4, 4, 12, 64, 32, jnp.float32, Tiling(16, 16, 32, 2), "random"),  # split K
    (20, 2, 8, 0, 8, 32, 32, jnp.float32, Tiling(32, 32, 16), "one_expert"),
    (9, 4, 8, 0, 8, 32, 16, jnp.bfloat16, None, "random"),
    (6, 2, 3, 9, 12, 32, 32, jnp.float32, Tiling(16, 16, 16, 2), "one_expert"),  # none local
  ],
)
def test_routed_products_random_sweep_against_reference(
  tokens, top_k, num_local, first, num_ids, hidden, inner, dtype, tiling, kind
):
  rng = np.random.default_rng(tokens + hidden + inner)
  ids = jnp.asarray(_random_ids(rng, tokens, top_k, num_ids, kind))
  x = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.float32).astype(dtype)
  gate, up = (
    jnp.asarray(rng.standard_normal((num_local, hidden, inner)) / hidden**0.5, dtype) for _ in "gu"
  )
  down = jnp.asarray(rng.standard_normal((num_local, inner, hidden)) / inner**0.5, dtype)
  route_w = jnp.asarray(rng.random(tokens * top_k), jnp.float32)
  block_m = tiling.block_m if tiling else 16
  routing = route_assignments(ids, num_local, block_m, first, interpret=INTERPRET)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  rows = grouped_swiglu_gathered(x, gate, up, routing, top_k, tiling=tiling, interpret=INTERPRET)
  want = grouped_swiglu_gathered_reference(x, gate, up, routing, top_k)
  assert rows.shape == (tokens * top_k, inner) and rows.dtype == dtype
  np.testing.assert_allclose(np.asarray(rows, np.float32), np.asarray(want, np.float32), tol, tol)
  down_tiling = None if tiling is None else Tiling(block_m, 16, 16, tiling.num_splits)
  out = grouped_matmul_scattered(
    rows, down, routing, route_w, tiling=down_tiling, interpret=INTERPRET
  )
  want = grouped_matmul_scattered_reference(rows, down, routing, route_w)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), tol, tol)
  local = (np.asarray(ids).ravel() >= first) & (np.asarray(ids).ravel() < first + num_local)
  assert not np.asarray(out, np.float32)[~local].any()  # other devices' assignments: zero


@pytest.mark.parametrize("tokens,dtype", [(1, jnp.float32), (2, jnp.bfloat16), (40, jnp.float32)])
def test_routed_swiglu_ffn_hands_split_partials_to_the_down_product(tokens, dtype):
  """H = I = 256, 4 experts, top 2: one or two tokens split both products' K four ways (the down
  product adds and gates the gate/up partials as it loads them), 40 tokens split neither; equal
  to the two references chained (the hidden rows rounded to the dtype in between)."""
  rng = np.random.default_rng(tokens)
  num_local, size, top_k = 4, 256, 2
  m = tokens * top_k
  block_m, split = default_block_m(m, num_local), 4 if tokens <= 2 else 1
  tilings = (Tiling(block_m, 64, 64, split), Tiling(block_m, 64, 64, split))
  ids = jnp.asarray(_random_ids(rng, tokens, top_k, num_local + 2, "random"))  # some not local
  x = jnp.asarray(rng.standard_normal((tokens, size)), dtype)
  gate, up, down = (
    jnp.asarray(rng.standard_normal((num_local, size, size)) / size**0.5, dtype) for _ in "gud"
  )
  route_w = jnp.asarray(rng.random(m), jnp.float32)
  routing = route_assignments(ids, num_local, block_m, interpret=INTERPRET)
  got = routed_swiglu_ffn(
    x, gate, up, down, routing, top_k, route_w, tilings=tilings, interpret=INTERPRET
  )
  hidden = grouped_swiglu_gathered_reference(x, gate, up, routing, top_k)
  want = grouped_matmul_scattered_reference(hidden, down, routing, route_w)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  assert got.shape == (m, size) and got.dtype == dtype
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), tol, tol)


def test_routed_products_check_their_routing():
  x = jnp.zeros((4, 32), jnp.float32)
  gate = jnp.zeros((3, 32, 16), jnp.float32)
  routing = route_assignments(jnp.zeros((4, 2), jnp.int32), 3, 16, interpret=True)
  with pytest.raises(ValueError, match="grouped_swiglu_gathered: routing: expected order"):
    grouped_swiglu_gathered(x, gate, gate, routing, 3, interpret=True)
  with pytest.raises(ValueError, match="routing: .* tiles of 32 rows, got .* tiles of 16"):
    grouped_swiglu_gathered(x, gate, gate, routing, 2, tiling=Tiling(32, 16, 16), interpret=True)
  rows, down = jnp.zeros((8, 16), jnp.float32), jnp.zeros((3, 16, 32), jnp.float32)
  with pytest.raises(ValueError, match="grouped_matmul_scattered: route_weights: expected"):
    grouped_matmul_scattered(rows, down, routing, jnp.zeros((8,), jnp.bfloat16), interpret=True)
  with pytest.raises(ValueError, match="grouped_matmul_scattered: weights: expected"):
    grouped_matmul_scattered(rows, gate, routing, jnp.zeros((8,)), interpret=True)


@pytest.mark.parametrize("tokens", [1, 256, 8192])
def test_routing_and_routed_products_lower_for_cuda(tokens):
  """Qwen3-30B-A3B's shapes (E 128, H 2048, I 768, top 8): the routing is one Triton call up to
  SERIAL_CHUNKS chunks of assignments, two past them; each product one."""
  ids = jax.ShapeDtypeStruct((tokens, 8), jnp.int32)
  text = _lower_for_cuda(lambda ids: route_assignments(ids, 128, 16, 64), ids)
  assert _custom_call_targets(text) == {"__gpu$xla.gpu.triton"} and "stablehlo.sort" not in text
  serial = tokens * 8 <= SERIAL_CHUNKS * BLOCK
  assert text.count('name = "moe_routing_counts"') == (0 if serial else 1)
  assert text.count('name = "moe_routing"') == 1
  m, e, h, i = tokens * 8, 128, 2048, 768
  routing = jax.eval_shape(lambda ids: route_assignments(ids, e, 16), ids)
  x = jax.ShapeDtypeStruct((tokens, h), jnp.bfloat16)
  gate = jax.ShapeDtypeStruct((e, h, i), jnp.bfloat16)
  tiling = Tiling(16, 64, 128, 1)
  text = _lower_for_cuda(
    lambda x, g, r: grouped_swiglu_gathered(x, g, g, r, 8, tiling=tiling), x, gate, routing
  )
  assert _custom_call_targets(text) == {"__gpu$xla.gpu.triton"}
  rows, down = (
    jax.ShapeDtypeStruct((m, i), jnp.bfloat16),
    jax.ShapeDtypeStruct((e, i, h), jnp.bfloat16),
  )
  route_w = jax.ShapeDtypeStruct((m,), jnp.float32)
  for splits in (1, 4):
    text = _lower_for_cuda(
      lambda a, d, r, w, s=splits: grouped_matmul_scattered(
        a, d, r, w, tiling=Tiling(16, 64, 64, s)
      ),
      rows,
      down,
      routing,
      route_w,
    )
    assert _custom_call_targets(text) == {"__gpu$xla.gpu.triton"}


def test_pipelined_loads_fit_in_shared_memory():
  """A stage of one Qwen3-30B-A3B token's down product (tiles 16 x 64 x 128 after a gate/up
  product split 4 ways) loads gate's and up's float32 partials, 2 x 4 x 16 x 128 x 4 bytes,
  beside 128 x 64 bfloat16 weights: 80 KiB, so 3 stages (2 in flight) fit in 227 KiB, not the
  4 asked (240 KiB, which a GPU refuses); the gate/up product keeps its 4."""
  assert fit_stages(Tiling(16, 64, 128, 1, 4, 4), 81920).num_stages == 3
  assert fit_stages(Tiling(16, 64, 128, 1, 4, 4), 36864).num_stages == 4
  assert fit_stages(Tiling(16, 64, 128, 1, 4, 4), 10**6).num_stages == 1
  t, k, h, i, e = 1, 8, 2048, 768, 128
  block_m = default_block_m(t * k, e)
  tilings = (Tiling(block_m, 64, 128, 4, 4, 4), Tiling(block_m, 64, 128, 1, 4, 4))

  def ffn(x, ids, gate, down, route_w):
    routing = route_assignments(ids, e, block_m)
    return routed_swiglu_ffn(x, gate, gate, down, routing, k, route_w, tilings=tilings)

  shapes = [((t, h), jnp.bfloat16), ((t, k), jnp.int32), ((e, h, i), jnp.bfloat16)]
  shapes += [((e, i, h), jnp.bfloat16), ((t * k,), jnp.float32)]
  text = _lower_for_cuda(ffn, *(jax.ShapeDtypeStruct(s, d) for s, d in shapes))
  stages = re.findall(r'name = "grouped_matmul".*?num_stages = (\d+)', text, re.DOTALL)
  assert stages == ["4", "3"]
