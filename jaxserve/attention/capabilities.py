"""What an attention backend is and does, as typed data: what callers decide by.

Every AttentionBackend carries one BackendCapabilities, set by the factory that builds it
(attention/backends.py) and kept, or updated, by every wrapper that changes what it does
(head_count_invariant clears kv_split, batch_invariant_attention sets tile_invariant, the
shard_map wrapper of parallel/sharded_attention.py keeps them). Code that must know which kernel
runs, or how it reduces, reads `kind` and the flags; a backend's `name` is for logs only, so the
decisions do not depend on the order wrappers were applied in.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

FLOAT_DTYPES = ("float32", "bfloat16")
KV_8BIT_DTYPES = ("float8_e4m3fn", "int8")  # pallas_kernels/ragged_paged_attention/kv_quant.py


class BackendKind(enum.Enum):
  """The implementation underneath every wrapper (the value is the config's name for it)."""

  REFERENCE = "reference"  # dense pure-jnp ground truth
  XLA = "xla"  # blocked XLA ops (jaxserve/attention/xla.py)
  PALLAS_GPU = "pallas_gpu"
  PALLAS_TPU = "pallas_tpu"


@dataclass(frozen=True)
class BackendCapabilities:
  """kv_split: one sequence's KV may be split over several programs whose partial softmax states
  are merged (flash decoding), with a split count that follows the step's shapes; such a
  backend's attend takes num_kv_splits. tile_invariant: a token's reduction order does not depend
  on the rest of the batch (its bucket, batch mates or prompt chunking). dtypes: the KV and
  compute dtypes it runs (config's names; a KV pool of any other dtype is refused before the
  engine takes device memory, attention/backends.check_kv_dtype). sliding_window, soft_cap: it
  applies them. interpret: the kernel runs in the Pallas interpreter (any platform, slow).
  large_page_arrays: its kernels address a layer's page array past 2**31 elements wherever
  pallas_kernels/ragged_paged_attention/gpu/addressing.py's `addressable` holds (the Pallas Triton
  kernels); the pool of any other backend keeps each array under 2**31 elements
  (device/kv_cache.py)."""

  kind: BackendKind
  kv_split: bool
  tile_invariant: bool
  dtypes: tuple[str, ...] = FLOAT_DTYPES + KV_8BIT_DTYPES
  sliding_window: bool = True
  soft_cap: bool = True
  interpret: bool = False
  large_page_arrays: bool = False

  def replace(self, **changes) -> BackendCapabilities:
    return dataclasses.replace(self, **changes)
