"""The kernels' tuned tile tables (pallas_kernels/tuning_table.py and the JSON beside each
kernel's tiling): the defaults they give are the ones the code gave before the numbers moved to
data (each expected tiling below was worked out by hand from the rules and constants of the
code before the move, commit 4f5cf36, except the grouped matmul's 16-row tiles, since measured
on an H200), a bad row is refused with a ValueError naming the file
and the row, and an installed wheel carries the tables."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

from pallas_kernels.grouped_matmul import tiles as gmm_tiles
from pallas_kernels.quantized_matmul import tiling as qmm_tiling
from pallas_kernels.ragged_paged_attention.gpu import tiling as attention_tiling
from pallas_kernels.ragged_paged_attention.gpu.tiling import Tiling
from pallas_kernels.tuning_table import load_table, parse_row

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
  "args, keywords, expected",
  [
    # decode, H100: 16 rows / 4 = block_q 4; 128-token KV tiles; split min(16, 264/64 -> 5,
    # 2048/128 / 4 = 4) = 4; 16-bit pages: 2 stages
    ((8, 8, 32, 8, 128), {"max_kv_len": 2048}, Tiling(4, 128, 4, 4, 4, 2, 4)),
    # decode, small shared memory, 8-bit pages: 64-token tiles, split min(16, 5, 32 / 4) = 5,
    # 3 stages
    (
      (8, 8, 32, 8, 128),
      {"max_kv_len": 2048, "page_itemsize": 1, "large_smem": False},
      Tiling(4, 64, 4, 4, 4, 3, 5),
    ),
    # prefill, 8-bit pages: 64 rows / 4 = block_q 16, 64-token tiles, no split, 3 stages
    ((512, 8, 32, 8, 128), {"max_kv_len": 2048, "page_itemsize": 1}, Tiling(16, 64, 4, 4, 4, 3, 1)),
    # decode, head_dim 256, 8-bit pages: 32-token tiles, 2 stages, split min(16, 264/32 -> 9, 64)
    ((4, 4, 16, 8, 256), {"max_kv_len": 8192, "page_itemsize": 1}, Tiling(8, 32, 2, 2, 4, 2, 9)),
    # prefill, head_dim 256, 3 q heads a kv head (padded to 4)
    (
      (100, 4, 24, 8, 256),
      {"max_kv_len": 1024, "large_smem": False},
      Tiling(16, 32, 3, 4, 4, 2, 1),
    ),
    # decode, head_dim 64, group 32: block_q max(1, 16 / 32) = 1; a 64-token context: no split
    ((16, 16, 64, 2, 64), {"max_kv_len": 64, "num_cores": 108}, Tiling(1, 128, 32, 32, 4, 2, 1)),
    # the keywords given still override the table
    (
      (8, 8, 32, 8, 128),
      {"max_kv_len": 2048, "block_kv": 32, "num_warps": 8, "num_kv_splits": 2},
      Tiling(4, 32, 4, 4, 8, 2, 2),
    ),
  ],
)
def test_the_attention_tiles_are_those_of_before(args, keywords, expected):
  assert attention_tiling.choose_tiling(*args, **keywords) == expected


QT = qmm_tiling.Tiling


@pytest.mark.parametrize(
  "args, keywords, expected",
  [
    ((4096, 14336), {}, QT(32, 256, 4)),  # 128 column blocks: K split 4 ways
    ((28672, 4096), {}, QT(32, 128, 1)),  # 896 column blocks: no split, K in halved blocks
    ((1024, 3072), {}, QT(32, 256, 4)),  # 3072 is no multiple of 256 * 8
    ((48, 80), {}, QT(16, 16, 1)),  # blocks halved until they divide N and K
    ((4096, 4096), {"quantize_x": True}, QT(128, 128, 8)),
    ((6144, 4096), {"block_n": 64, "quantize_x": True}, QT(64, 128, 4)),
    ((4096, 14336), {"block_n": 64, "block_k": 128}, QT(64, 128, 8)),
  ],
)
def test_the_quantized_matmul_tiles_are_those_of_before(args, keywords, expected):
  assert qmm_tiling.default_tiling(*args, **keywords) == expected


GT = gmm_tiles.Tiling


@pytest.mark.parametrize(
  "args, expected",
  [
    ((8, 2048, 768, 128, True), GT(16, 128, 128, 1, 4, 3)),  # Qwen3-30B-A3B, batch 1 (H200)
    ((65536, 2048, 768, 128, True), GT(64, 64, 64, 1, 4, 3)),  # an 8192-token prefill
    ((65536, 2048, 768, 128, False), GT(64, 128, 64, 1, 4, 3)),
    ((256, 4096, 1536, 16, False), GT(32, 128, 64, 1, 4, 3)),  # 32 rows a group
    ((4, 768, 96, 8, True), GT(16, 32, 128, 1, 4, 3)),  # block_n halved to divide 96
    ((24, 48, 80, 2, False), GT(32, 16, 16, 1, 4, 3)),
  ],
)
def test_the_grouped_matmul_tiles_are_those_of_before(args, expected):
  assert gmm_tiles.default_tiling(*args) == expected


@dataclass(frozen=True)
class Row:
  size: int
  wide: bool
  limit: int | None

  def check(self) -> None:
    if self.size < 1:
      raise ValueError("size must be >= 1")


@pytest.mark.parametrize(
  "row, message",
  [
    ({"size": 1, "wide": True}, r"missing fields \['limit'\]"),
    ({"size": 1, "wide": True, "limit": None, "extra": 2}, r"unknown fields \['extra'\]"),
    ({"size": "1", "wide": True, "limit": None}, "size must be int"),
    ({"size": True, "wide": True, "limit": None}, "size must be int"),
    ({"size": 1, "wide": 0, "limit": None}, "wide must be bool"),
    ({"size": 1, "wide": True, "limit": 1.5}, "limit must be int or null"),
    ({"size": 0, "wide": True, "limit": None}, "size must be >= 1"),
    ([1, True, None], "must be an object"),
  ],
)
def test_a_bad_row_is_refused_by_name(row, message):
  with pytest.raises(ValueError, match=message) as err:
    parse_row(row, Row, "t.json: row 3")
  assert str(err.value).startswith("t.json: row 3")


def test_a_table_file_is_read_from_its_package(tmp_path, monkeypatch):
  package = tmp_path / "tables_pkg"
  package.mkdir()
  (package / "__init__.py").write_text("")
  good = {"size": 2, "wide": False, "limit": 64}
  (package / "good.json").write_text(json.dumps({"about": "x", "rows": [good]}))
  (package / "bad.json").write_text(json.dumps({"rows": [good, {**good, "size": -1}]}))
  (package / "flat.json").write_text(json.dumps([good]))
  monkeypatch.syspath_prepend(str(tmp_path))
  assert load_table("tables_pkg", "good.json", Row) == (Row(2, False, 64),)
  with pytest.raises(ValueError, match=r"tables_pkg/bad.json: row 1 \{.*'size': -1.*size must"):
    load_table("tables_pkg", "bad.json", Row)
  with pytest.raises(ValueError, match='tables_pkg/flat.json: must be an object with a "rows"'):
    load_table("tables_pkg", "flat.json", Row)
  with pytest.raises(ValueError, match="tables_pkg/none.json: cannot read the table"):
    load_table("tables_pkg", "none.json", Row)


def test_each_kernels_table_is_complete_and_checked():
  attention = attention_tiling.tile_table()
  assert len(attention) == 16
  with pytest.raises(ValueError, match="t: row 16 .*a second row"):
    attention_tiling.check_table(attention + attention[:1], "t")
  wide_rows = tuple(r for r in attention if r.max_head_dim is not None or r.decode_only)
  with pytest.raises(ValueError, match="no row for decode_only=False, .*max_head_dim=null"):
    attention_tiling.check_table(wide_rows, "t")
  with pytest.raises(ValueError, match="rows must be a power of two"):
    parse_row({**vars(attention[0]), "rows": 24}, attention_tiling.TileRow, "t")
  quantized = tuple(qmm_tiling.tile_table().values())
  with pytest.raises(ValueError, match="t: no row for quantize_x true"):
    qmm_tiling.index_table(quantized[:1], "t")
  with pytest.raises(ValueError, match="quantize_x needs block_k 128"):
    parse_row({**vars(quantized[1]), "block_k": 256}, qmm_tiling.TileRow, "t")
  grouped = tuple(gmm_tiles.tile_table().values())
  with pytest.raises(ValueError, match="t: no row for block_m 16, gated true"):
    gmm_tiles.index_table(tuple(r for r in grouped if (r.block_m, r.gated) != (16, True)), "t")
  with pytest.raises(ValueError, match="t: row 6 .*a second row"):
    gmm_tiles.index_table(grouped + grouped[-1:], "t")


def test_the_wheel_ships_every_table():
  """pyproject.toml's package data names every JSON file under pallas_kernels/ (setuptools
  installs only what it names)."""
  pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
  patterns = pyproject["tool"]["setuptools"]["package-data"]["pallas_kernels"]
  tables = sorted(
    str(p.relative_to(ROOT / "pallas_kernels")) for p in (ROOT / "pallas_kernels").rglob("*.json")
  )
  assert len(tables) == 3
  assert [t for t in tables if not any(fnmatch.fnmatch(t, p) for p in patterns)] == []
