"""The Pallas grouped matmul (pallas_kernels/grouped_matmul) against hand-computed values and its
pure-jnp reference: empty groups, every row in one group, rows past sum(group_sizes), sizes that
overrun the rows, split K, the gated SwiGLU form; its row-tile map, its shape checks, its default
tiling, and its lowering for CUDA. Compiled on a GPU, in Pallas interpret mode elsewhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.grouped_matmul import tiles
from pallas_kernels.grouped_matmul.gpu import Tiling, grouped_matmul, grouped_swiglu
from pallas_kernels.grouped_matmul.reference import (
  grouped_matmul_reference,
  grouped_swiglu_reference,
)
from pallas_kernels.grouped_matmul.tiles import (
  TARGET_PROGRAMS,
  TileRow,
  default_tiling,
  index_table,
  num_tiles,
  supports,
  tile_map,
  tile_table,
)
from tests.pallas_kernels.test_gpu_lowering import _custom_call_targets, _lower_for_cuda

INTERPRET = jax.default_backend() != "gpu"
SMALL = Tiling(block_m=16, block_n=16, block_k=16)


def _silu(x):
  return x / (1.0 + np.exp(-x))


@pytest.mark.parametrize("splits", [1, 2])
def test_hand_computed(splits):
  """Rows 0-1 group 0 (weights 1 * I), rows 2-3 group 2 (3 * I, plus w[2][17, 5] = 1), row 4 past
  the groups; group 1 is empty (its weights, 100 * I, must not be read into any row)."""
  rows = np.zeros((5, 32), np.float32)
  rows[0, 0], rows[1, 1], rows[2, 2], rows[3, 17], rows[4, 4] = 1.0, 2.0, 3.0, 4.0, 5.0
  eye = np.eye(32, 16, dtype=np.float32)
  weights = np.stack([eye, 100 * eye, 3 * eye])  # [3, 32, 16]
  weights[2, 17, 5] = 1.0
  sizes = np.array([2, 0, 2], np.int32)
  out = np.asarray(
    grouped_matmul(rows, weights, sizes, tiling=Tiling(16, 16, 16, splits), interpret=INTERPRET)
  )
  expected = np.zeros((5, 16), np.float32)
  expected[0, 0], expected[1, 1], expected[2, 2], expected[3, 5] = 1.0, 2.0, 9.0, 4.0
  np.testing.assert_array_equal(out, expected)
  up = np.stack([2 * eye, eye, eye])  # [3, 32, 16]
  gated = grouped_swiglu(
    rows, weights, up, sizes, tiling=Tiling(16, 16, 16, splits), interpret=INTERPRET
  )
  expected = np.zeros((5, 16), np.float32)
  expected[0, 0], expected[1, 1] = _silu(1.0) * 2.0, _silu(2.0) * 4.0
  expected[2, 2] = _silu(9.0) * 3.0  # row 3: up's column 5 is 0
  np.testing.assert_allclose(np.asarray(gated), expected, rtol=1e-6)


def test_tile_map_hand_computed():
  """30 rows, tiles of 16: group 0 rows 0-2, group 1 empty, group 2 rows 3-22 (two tiles),
  group 3 row 23, the tail (group 4) rows 24-29; one tile left unused."""
  tiles = num_tiles(30, 4, 16)
  assert tiles == (30 + 5 * 15) // 16 == 6
  got = [np.asarray(a).tolist() for a in tile_map(jnp.array([3, 0, 20, 1]), 30, 16, tiles)]
  assert got == [[0, 2, 2, 3, 4, 4], [0, 3, 19, 23, 24, 0], [3, 16, 4, 1, 6, 0]]


@pytest.mark.parametrize("seed", range(6))
def test_tile_map_covers_every_row_once(seed):
  rng = np.random.default_rng(seed)
  num_rows, num_groups = int(rng.integers(1, 300)), int(rng.integers(1, 40))
  block_m = int(rng.choice([16, 32, 64]))
  sizes = rng.multinomial(int(rng.integers(0, num_rows + 1)), np.ones(num_groups) / num_groups)
  if seed == 0:
    sizes[:] = 0
    sizes[num_groups // 2] = num_rows + 7  # one group holds every row, and overruns M
  tiles = num_tiles(num_rows, num_groups, block_m)
  group, start, count = (
    np.asarray(a) for a in tile_map(jnp.asarray(sizes), num_rows, block_m, tiles)
  )
  owner = np.full(num_rows, -1)
  ends = np.minimum(np.cumsum(sizes), num_rows)
  for g, s, c in zip(group, start, count, strict=True):
    assert 0 <= c <= block_m
    if c:
      assert (owner[s : s + c] == -1).all()  # each row in one tile
      owner[s : s + c] = g
  want = np.searchsorted(ends, np.arange(num_rows), side="right")  # each row's group, G past
  np.testing.assert_array_equal(owner, want)


def _case(rng, m, k, n, g, dtype, sizes=None):
  rows = jnp.asarray(rng.standard_normal((m, k)), jnp.float32).astype(dtype)
  weights = [
    jnp.asarray(rng.standard_normal((g, k, n)) / k**0.5, jnp.float32).astype(dtype) for _ in "gu"
  ]
  if sizes is None:
    cuts = np.sort(rng.integers(0, m + 1, g))  # repeated cuts: empty groups; sum <= m
    sizes = np.diff(np.concatenate([[0], cuts])).astype(np.int32)  # rows past the sum
  return rows, weights, jnp.asarray(sizes, jnp.int32)


@pytest.mark.parametrize(
  "m,k,n,g,dtype,tiling,sizes",
  [
    (1, 16, 16, 1, jnp.float32, SMALL, [1]),
    (37, 64, 32, 5, jnp.float32, Tiling(16, 32, 16, 2), None),
    (40, 32, 48, 4, jnp.float32, SMALL, [0, 40, 0, 0]),  # every row in one group
    (50, 64, 32, 3, jnp.float32, Tiling(32, 16, 32), [30, 30, 30]),  # sizes overrun M
    (64, 128, 64, 8, jnp.bfloat16, None, None),
    (100, 64, 64, 6, jnp.bfloat16, Tiling(64, 32, 16, 4, num_warps=8), None),
    (24, 256, 128, 16, jnp.bfloat16, Tiling(16, 64, 32, 8), np.full(16, 1)),  # 8 rows past
  ],
)
def test_random_sweep_against_reference(m, k, n, g, dtype, tiling, sizes):
  rng = np.random.default_rng(m * k + n)
  rows, (gate, up), sizes = _case(rng, m, k, n, g, dtype, sizes)
  tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
  out = grouped_matmul(rows, gate, sizes, tiling=tiling, interpret=INTERPRET)
  assert out.shape == (m, n) and out.dtype == dtype
  want = np.asarray(grouped_matmul_reference(rows, gate, sizes), np.float32)
  np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=tolerance, atol=tolerance)
  past = min(int(np.sum(sizes)), m)
  assert not np.asarray(out, np.float32)[past:].any()  # zero past the groups
  gated = grouped_swiglu(rows, gate, up, sizes, tiling=tiling, interpret=INTERPRET)
  want = np.asarray(grouped_swiglu_reference(rows, gate, up, sizes), np.float32)
  np.testing.assert_allclose(np.asarray(gated, np.float32), want, rtol=tolerance, atol=tolerance)


def _args(m=4, k=32, n=16, g=3, dtype=jnp.bfloat16):
  return jnp.zeros((m, k), dtype), jnp.zeros((g, k, n), dtype), jnp.zeros((g,), jnp.int32)


@pytest.mark.parametrize(
  "args,tiling,field",
  [
    ((jnp.zeros((4, 32, 1), jnp.bfloat16),) + _args()[1:], None, "rows: expected [M, K]"),
    ((jnp.zeros((4, 32), jnp.int8),) + _args()[1:], None, "rows: expected [M, K] bfloat16"),
    ((_args()[0], jnp.zeros((3, 16, 16), jnp.bfloat16), _args()[2]), None, "weights: expected"),
    ((_args()[0], jnp.zeros((3, 32, 16), jnp.float32), _args()[2]), None, "weights: expected"),
    (_args()[:2] + (jnp.zeros((4,), jnp.int32),), None, "group_sizes: expected int[3]"),
    (_args()[:2] + (jnp.zeros((3,), jnp.float32),), None, "group_sizes: expected int[3]"),
    (_args(n=24), None, "weights: K and N must be multiples of 16"),
    (_args(), Tiling(24, 16, 16), "tiling: blocks must be powers of two"),
    (_args(), Tiling(16, 32, 16), "tiling: N 16 must be a multiple of block_n"),
    (_args(), Tiling(16, 16, 16, 4), "tiling: N 16 must be a multiple of block_n and K 32"),
  ],
)
def test_bad_shapes_raise_value_errors_naming_the_array(args, tiling, field):
  with pytest.raises(ValueError, match="grouped_matmul: " + field.replace("[", r"\[")):
    grouped_matmul(*args, tiling=tiling, interpret=True)
  rows, weights, sizes = args
  with pytest.raises(ValueError, match="grouped_swiglu: "):
    grouped_swiglu(rows, weights, weights, sizes, tiling=tiling, interpret=True)


def test_no_rows_gives_an_empty_output():
  out = grouped_matmul(*_args(m=0), interpret=True)
  assert out.shape == (0, 16) and out.dtype == jnp.bfloat16


def test_default_tiling_divides_and_fills_the_gpu():
  """Qwen3-30B-A3B (E 128, H 2048, I 768, top 8) and Mixtral (E 8, H 4096, I 14336, top 2)
  at decode and prefill row counts, gated (gate/up) and not (down)."""
  for e, h, i, top in ((128, 2048, 768, 8), (8, 4096, 14336, 2), (16, 2048, 768, 8)):
    for tokens in (1, 8, 64, 256, 8192):
      m = tokens * top
      for k, n, gated in ((h, i, True), (i, h, False)):
        t = default_tiling(m, k, n, e, gated)
        assert n % t.block_n == 0 and k % (t.block_k * t.num_splits) == 0
        if tile_table()[t.block_m, gated].split_k:
          programs = min(m, e) * n // t.block_n * t.num_splits
          assert programs >= TARGET_PROGRAMS or t.num_splits == 8
        else:
          assert t.num_splits == 1
  assert default_tiling(8, 2048, 768, 128, True) == Tiling(16, 128, 128, 1, 4, 3)  # batch 1
  assert default_tiling(8, 768, 2048, 128, False) == Tiling(16, 64, 128, 1, 4, 4)
  assert default_tiling(65536, 2048, 768, 128, True).block_m == 64  # an 8192-token prefill
  assert default_tiling(8, 2048, 768, 128, True).num_splits == 1  # split K lost on an H200


def test_a_row_with_split_k_splits_until_the_gpu_is_full(monkeypatch):
  """A table row with split_k: K halves until TARGET_PROGRAMS programs (or 8 splits): one token
  of Qwen3-30B-A3B's gate/up product, 8 tiles x 12 column blocks of 64, splits 4 ways."""
  rows = tuple(
    TileRow(16, gated, 64, 128, split_k=True, num_warps=4, num_stages=4) for gated in (True, False)
  )
  monkeypatch.setattr(tiles, "tile_table", lambda: index_table(rows, "test"))
  assert default_tiling(8, 2048, 768, 128, True) == Tiling(16, 64, 128, 4, 4, 4)
  assert default_tiling(8, 768, 2048, 128, False).num_splits == 2  # 8 x 32 programs
  assert default_tiling(1024, 2048, 768, 128, True).num_splits == 1  # 128 x 12 programs
  assert supports(8, 2048, 768, 128) and not supports(8, 2048, 760, 128)
  assert not supports(8, 7168, 2048, 256)  # 3.8e9 weight elements: past int32 offsets


@pytest.mark.parametrize("tokens", [1, 64, 8192])
def test_lowers_to_one_triton_call_for_cuda(tokens):
  """Qwen3-30B-A3B's experts: the fused gate/up [E, H, I] and the down projection [E, I, H]."""
  m, e, h, i = tokens * 8, 128, 2048, 768
  sizes = jax.ShapeDtypeStruct((e,), jnp.int32)
  gate = jax.ShapeDtypeStruct((e, h, i), jnp.bfloat16)
  rows = jax.ShapeDtypeStruct((m, h), jnp.bfloat16)
  for text in (
    _lower_for_cuda(grouped_swiglu, rows, gate, gate, sizes),
    _lower_for_cuda(
      grouped_matmul,
      jax.ShapeDtypeStruct((m, i), jnp.bfloat16),
      jax.ShapeDtypeStruct((e, i, h), jnp.bfloat16),
      sizes,
    ),
  ):
    assert _custom_call_targets(text) == {"__gpu$xla.gpu.triton"}
    assert text.count("custom_call @__gpu$xla.gpu.triton") == 1
    assert 'name = "grouped_matmul"' in text
