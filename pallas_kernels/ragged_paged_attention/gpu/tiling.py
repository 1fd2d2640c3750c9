"""Tile sizes of the GPU ragged paged-attention kernel: the defaults, how they follow the batch
shape and the GPU, and their validation. The kernel itself is in gpu.py."""

from __future__ import annotations

from dataclasses import dataclass

import jax
from jax.experimental import pallas as pl

MIN_DOT_ROWS = 16  # tl.dot needs M, N, K >= 16
MAX_ROWS = 128
MAX_KV_SPLITS = 16
DEFAULT_NUM_CORES = 132  # streaming multiprocessors of an H100 SXM


@dataclass(frozen=True)
class Tiling:
  """Static tile sizes: block_q query tokens x padded_group q heads rows, block_kv KV tokens."""

  block_q: int
  block_kv: int
  group: int
  padded_group: int
  num_warps: int
  num_stages: int
  num_kv_splits: int = 1

  @property
  def rows(self) -> int:
    return self.block_q * self.padded_group


def _is_power_of_two(value: int) -> bool:
  return value >= 1 and not value & (value - 1)


def choose_tiling(
  num_tokens: int,
  num_seq_slots: int,
  num_q_heads: int,
  num_kv_heads: int,
  head_dim: int,
  *,
  max_kv_len: int,
  page_itemsize: int = 2,
  num_cores: int = DEFAULT_NUM_CORES,
  large_smem: bool = True,
  block_q: int | None = None,
  block_kv: int | None = None,
  num_warps: int | None = None,
  num_stages: int | None = None,
  num_kv_splits: int | None = None,
) -> Tiling:
  """Defaults: 16 rows per tile for decode-only shapes (T <= S), 64 otherwise; block_kv 128
  tokens for decode-only shapes on GPUs with Hopper-sized shared memory (large_smem; docs/
  DECISIONS.md, "The GPU attention kernel's decode tiles"), else 64 (32 for head_dim 256); 4
  warps; default_stages pipeline stages; KV split in up to 16 parts (flash decoding)
  only for decode-only shapes with fewer than 2 programs per core."""
  group = num_q_heads // num_kv_heads
  padded_group = pl.next_power_of_2(group)
  if block_q is None:
    target_rows = MIN_DOT_ROWS if num_tokens <= num_seq_slots else 64
    block_q = max(1, target_rows // padded_group)
  if block_kv is None:
    decode_only = num_tokens <= num_seq_slots
    block_kv = 32 if head_dim > 128 else (128 if decode_only and large_smem else 64)
  if num_kv_splits is None:
    num_kv_splits = 1
    num_programs = num_seq_slots * num_kv_heads
    if num_tokens <= num_seq_slots and num_programs < 2 * num_cores:
      num_kv_splits = max(
        1,
        min(
          MAX_KV_SPLITS, pl.cdiv(2 * num_cores, num_programs), pl.cdiv(max_kv_len, block_kv) // 4
        ),
      )
  tiling = Tiling(
    block_q=block_q,
    block_kv=block_kv,
    group=group,
    padded_group=padded_group,
    num_warps=4 if num_warps is None else num_warps,
    num_stages=default_stages(head_dim, page_itemsize) if num_stages is None else num_stages,
    num_kv_splits=num_kv_splits,
  )
  validate_tiling(tiling)
  return tiling


def default_stages(head_dim: int, page_itemsize: int) -> int:
  """Pipeline stages: the KV loop prefetches its next tile's page ids, so a tile's K/V copies
  get num_stages - 1 shared-memory buffers; 8-bit pages take 2 buffers (3 stages), 16-bit
  pages and head_dim 256 one (2 stages), which keeps 3 programs an SM."""
  return 3 if page_itemsize == 1 and head_dim <= 128 else 2


def validate_tiling(tiling: Tiling) -> None:
  if not _is_power_of_two(tiling.block_q):
    raise ValueError(
      f"ragged_paged_attention: block_q: must be a power of two, got {tiling.block_q}"
    )
  if not MIN_DOT_ROWS <= tiling.rows <= max(MAX_ROWS, tiling.padded_group):
    raise ValueError(
      f"ragged_paged_attention: block_q: block_q * padded q heads per kv head = "
      f"{tiling.block_q} * {tiling.padded_group} must lie in "
      f"[{MIN_DOT_ROWS}, {MAX_ROWS}]"
    )
  if not _is_power_of_two(tiling.block_kv) or tiling.block_kv < MIN_DOT_ROWS:
    raise ValueError(
      f"ragged_paged_attention: block_kv: must be a power of two >= "
      f"{MIN_DOT_ROWS}, got {tiling.block_kv}"
    )
  if tiling.num_kv_splits < 1:
    raise ValueError(
      f"ragged_paged_attention: num_kv_splits: must be >= 1, got {tiling.num_kv_splits}"
    )
  if tiling.num_warps < 1 or tiling.num_stages < 1:
    raise ValueError(
      f"ragged_paged_attention: num_warps/num_stages must be >= 1, got "
      f"{tiling.num_warps}/{tiling.num_stages}"
    )


def has_large_smem() -> bool:
  """Hopper and newer (compute capability >= 9) hold 3 stages of 128-token K and V tiles."""
  capability = getattr(jax.devices()[0], "compute_capability", None)
  try:
    return capability is not None and float(capability) >= 9.0
  except ValueError:
    return False


def num_cores() -> int:
  device = jax.devices()[0]
  return getattr(device, "core_count", None) or DEFAULT_NUM_CORES
