"""The one attention interface the model calls, and how a backend is chosen.

A backend writes the step's new K/V into their pages (in place under donation) and then attends over
the paged cache. It takes one group of the pool's stacked slots (attention/metadata.py KVPages: a
group's k_pool, v_pool [slots_per_group, ...]) and the layer's slot in it, kv_slot int32[1], a
traced value, and reads and writes that slot only. "reference" is the dense pure-jnp ground truth,
"xla" the blocked XLA path used on CPU, "pallas_gpu" and "pallas_tpu" the Pallas kernels. "auto"
picks by JAX's default backend. Each backend carries its BackendCapabilities
(attention/capabilities.py): the wrappers here decide by them, and keep them true of what they
return.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax

from jaxserve.attention.capabilities import BackendCapabilities, BackendKind
from jaxserve.attention.metadata import AttentionMetadata
from jaxserve.attention.xla import ragged_paged_attention_xla
from pallas_kernels.ragged_paged_attention.reference import (
  ragged_paged_attention_reference,
  write_kv_reference,
)

AttendFn = Callable[..., jax.Array]
WriteFn = Callable[..., tuple[jax.Array, jax.Array]]


@dataclass(frozen=True)
class AttentionBackend:
  """A pair of (write_kv, attend) functions with the reference's signatures, what they can do
  (`capabilities`, for decisions) and a `name` (for logs)."""

  name: str
  attend: AttendFn
  write_kv: WriteFn
  capabilities: BackendCapabilities

  def __call__(
    self,
    q: jax.Array,  # [T, num_q_heads, head_dim]
    new_k: jax.Array,  # [T, num_kv_heads, head_dim]
    new_v: jax.Array,  # [T, num_kv_heads, head_dim]
    k_pool: jax.Array,  # [slots_per_group, num_kv_heads, num_pages, page_size, head_dim]
    v_pool: jax.Array,  # [slots_per_group, num_kv_heads, num_pages, page_size, head_dim]
    kv_slot: jax.Array,  # int32[1]: the layer's slot in its group
    slot_mapping: jax.Array,  # int32[T]
    metadata: AttentionMetadata,
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Writes new K/V into slot kv_slot, then attends over it. Returns (out [T, num_q_heads,
    head_dim], k_pool, v_pool)."""
    k_pool, v_pool = self.write_kv(k_pool, v_pool, kv_slot, new_k, new_v, slot_mapping)
    out = self.attend(
      q,
      k_pool,
      v_pool,
      kv_slot,
      metadata.block_tables,
      metadata.seq_lens,
      metadata.query_start_loc,
      metadata.num_seqs,
      sm_scale=sm_scale,
      sliding_window=sliding_window,
      soft_cap=soft_cap,
    )
    return out, k_pool, v_pool

  def replace(self, **changes) -> AttentionBackend:
    return dataclasses.replace(self, **changes)


REFERENCE = AttentionBackend(
  "reference",
  ragged_paged_attention_reference,
  write_kv_reference,
  BackendCapabilities(BackendKind.REFERENCE, kv_split=False, tile_invariant=False),
)
XLA = AttentionBackend(
  "xla",
  ragged_paged_attention_xla,
  write_kv_reference,
  BackendCapabilities(BackendKind.XLA, kv_split=False, tile_invariant=False),
)


def pallas_gpu(interpret: bool = False) -> AttentionBackend:
  """The Pallas (Triton) GPU kernel; it splits the KV of small decode batches (flash decoding)
  and picks its tiles by the step's shape. interpret: in the Pallas interpreter (any platform)."""
  from pallas_kernels.ragged_paged_attention.gpu import attention as gpu

  return _kernel(
    "pallas_gpu",
    gpu.ragged_paged_attention,
    gpu.write_kv,
    BackendCapabilities(
      BackendKind.PALLAS_GPU,
      kv_split=True,
      tile_invariant=False,
      interpret=interpret,
      large_page_arrays=not interpret,
    ),
  )


def pallas_tpu(interpret: bool = False) -> AttentionBackend:
  """The Pallas Mosaic TPU kernel: fixed query and KV blocks whatever the batch, and rows of
  other sequences leave a row's softmax state exactly unchanged (tile invariant as it is).
  interpret: in Pallas TPU interpret mode (any platform)."""
  from pallas_kernels.ragged_paged_attention.tpu import attention as tpu

  return _kernel(
    "pallas_tpu",
    tpu.ragged_paged_attention,
    tpu.write_kv,
    BackendCapabilities(
      BackendKind.PALLAS_TPU, kv_split=False, tile_invariant=True, interpret=interpret
    ),
  )


def _kernel(
  name: str, attend: AttendFn, write_kv: WriteFn, capabilities: BackendCapabilities
) -> AttentionBackend:
  if not capabilities.interpret:
    return AttentionBackend(name, attend, write_kv, capabilities)
  return AttentionBackend(
    f"{name} (interpret)",
    functools.partial(attend, interpret=True),
    functools.partial(write_kv, interpret=True),
    capabilities,
  )


_FACTORIES = {
  "reference": lambda: REFERENCE,
  "xla": lambda: XLA,
  "pallas_gpu": pallas_gpu,
  "pallas_tpu": pallas_tpu,
}


def head_count_invariant(backend: AttentionBackend) -> AttentionBackend:
  """`backend` with a reduction order that does not depend on the number of heads per device:
  a kv_split backend (the GPU kernel) otherwise picks its KV split count from (sequence slots x
  kv heads), which halves under tensor parallelism (tp_invariant_reductions). The others
  already are."""
  if not backend.capabilities.kv_split:
    return backend
  return backend.replace(
    name=f"{backend.name} (1 KV split)",
    attend=functools.partial(backend.attend, num_kv_splits=1),
    capabilities=backend.capabilities.replace(kv_split=False),
  )


BATCH_INVARIANT_ROWS = 16  # GPU kernel rows per program (query tokens x padded q heads per kv head)


def batch_invariant_attention(backend: AttentionBackend) -> AttentionBackend:
  """`backend` with tiles that do not follow the batch shape (batch_invariant; the result is
  tile_invariant unless it is the reference, which is left as it is). The GPU kernel otherwise
  picks its KV tile size by whether the step is decode-only, its query rows per program
  likewise, and splits the KV of small batches (flash decoding), so a token's reduction over its
  KV depends on its batch mates (the row count of a tile changes a row's bits in the
  interpreter). Here every step runs BATCH_INVARIANT_ROWS query rows per program and reduces in
  KV tiles of one fixed size, in position order, unsplit. The XLA path reduces in fixed,
  position-aligned blocks but its contractions follow the token count on the CPU: it runs them
  in a fixed order (xla.py fixed_order). A tile_invariant backend (the TPU kernel) is returned
  as it is."""
  capabilities = backend.capabilities
  if capabilities.tile_invariant:
    return backend
  if capabilities.kind is BackendKind.XLA:
    return backend.replace(
      name=f"{backend.name} (batch invariant)",
      attend=functools.partial(backend.attend, fixed_order=True),
      capabilities=capabilities.replace(tile_invariant=True),
    )
  if capabilities.kind is not BackendKind.PALLAS_GPU:
    return backend

  def attend(q, k_pool, *args, **kwargs):
    block_kv = 32 if q.shape[-1] > 128 else 64
    padded_group = 1 << (q.shape[1] // k_pool.shape[1] - 1).bit_length()
    return backend.attend(
      q,
      k_pool,
      *args,
      num_kv_splits=1,
      block_kv=block_kv,
      block_q=max(1, BATCH_INVARIANT_ROWS // padded_group),
      **kwargs,
    )

  return backend.replace(
    name=f"{backend.name} (batch invariant)",
    attend=attend,
    capabilities=capabilities.replace(kv_split=False, tile_invariant=True),
  )


def check_kv_dtype(backend: AttentionBackend, kv_dtype: str) -> None:
  """Raises a one-line ValueError unless `backend` reads KV pages of dtype `kv_dtype`."""
  if kv_dtype not in backend.capabilities.dtypes:
    raise ValueError(
      f"kv_cache_dtype: the {backend.name} attention backend cannot read {kv_dtype} KV pages "
      f"(it reads {', '.join(backend.capabilities.dtypes)})"
    )


def quantized_kv_backend(
  backend: AttentionBackend, kv_dtype: str, k_scale: float, v_scale: float
) -> AttentionBackend:
  """`backend` over 8-bit pages of `kv_dtype` (float8_e4m3fn, int8) holding K / k_scale and
  V / v_scale: its write quantizes, its attention dequantizes (kv_quant.py). Raises ValueError
  (check_kv_dtype) when it cannot read them."""
  check_kv_dtype(backend, kv_dtype)
  scales = dict(k_scale=k_scale, v_scale=v_scale)
  return backend.replace(
    name=f"{backend.name} ({kv_dtype} KV)",
    attend=functools.partial(backend.attend, **scales),
    write_kv=functools.partial(backend.write_kv, **scales),
  )


def get_attention_backend(name: str = "auto", platform: str | None = None) -> AttentionBackend:
  """Returns the backend called `name`; "auto" picks the kernel for `platform` (default: JAX's)."""
  if name == "auto":
    platform = platform or jax.default_backend()
    name = {"gpu": "pallas_gpu", "cuda": "pallas_gpu", "tpu": "pallas_tpu"}.get(platform, "xla")
  if name not in _FACTORIES:
    raise ValueError(
      f"attention_backend: unknown backend {name!r} (known: {', '.join(_FACTORIES)})"
    )
  return _FACTORIES[name]()
