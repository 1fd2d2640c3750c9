"""fp8 experts (ModelConfig.expert_quantization "fp8_channel" / "fp8_block", models/moe_config.py):
their weights as one pytree per projection, the W8A8 grouped matmuls over them, and the
quantizer of float experts.

A projection's stacked experts are an `Fp8Weights`: `weight` float8_e4m3fn [E, N, K] (each
expert's Linear [out, in], Hugging Face's layout stacked: K contiguous for the fp8 tensor cores,
and a checkpoint's fp8 experts load without a transpose) and float32 `scale`, [E, N] per
channel or [E, N / 128, K / 128] per 128 x 128 block. In the params tree they are the leaves
`experts/<projection>` and `experts/<projection>_scale` (models/layers/moe.py).

The arithmetic is W8A8 (pallas_kernels/grouped_matmul/fp8.py's docstring): the rows are quantized
to e4m3 dynamically, per token (per channel) or per token and 128 of K (blocks, as DeepSeek-V3 /
Qwen3-FP8 run), the products of e4m3 values summed in float32 and both scales applied to the
sums; the gated form computes silu(gate) * up in float32 and rounds once. Which code runs it
(`kernel`, as models/grouped_matmul.py's):

  CUDA GPUs ("auto")       the Pallas (Triton) fp8 grouped matmul: fp8 tensor-core dots, only
                           each group's weights read, at 8 bits (GPUs with fp8 tensor cores,
                           quantization/capabilities.py's rule for fp8; an older GPU, such as
                           an A100 serving a block-wise fp8 MoE, takes the ragged_dot path)
  elsewhere ("auto"), and  ragged_dot on the same values: the e4m3 rows and weights converted to
  "ragged_dot"             bfloat16 (exact: e4m3 is a subset of bfloat16), float32 accumulation,
                           scales applied to the float32 sums (per channel once, per block one
                           ragged_dot per 128 of K), so CPU and TPU compute what the kernel does
                           up to the order of the float32 sums
  "pallas"                 the kernel, in Pallas interpret mode off GPUs (tests)

A whole FFN on CUDA takes the routed kernels (`fp8_routed_swiglu_ffn`: the routing kernel's
order, the tokens gathered into the gate/up product and the outputs scattered from the down
product, models/grouped_matmul.py chooses); these functions are the sorted path's products.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxserve.quantization.capabilities import refusal
from jaxserve.quantization.quantize import quantize_weight
from jaxserve.quantization.scheme import SCHEMES
from jaxserve.runtime.device_description import DeviceDescription
from pallas_kernels.grouped_matmul import fp8 as pallas_fp8
from pallas_kernels.grouped_matmul import tiles
from pallas_kernels.grouped_matmul.fp8_routed import (
  grouped_matmul_fp8_scattered,
  grouped_swiglu_fp8_gathered,
)
from pallas_kernels.grouped_matmul.tiles import Routing

SCALE_SUFFIX = "_scale"  # experts/<projection>_scale beside experts/<projection>


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Fp8Weights:
  """One projection's stacked fp8 experts (module docstring)."""

  weight: jax.Array  # float8_e4m3fn [E, N, K]: each expert's [out, in]
  scale: jax.Array  # float32 [E, N] (per channel) or [E, N / 128, K / 128] (128 x 128 blocks)

  @property
  def dims(self) -> tuple[int, int, int]:
    """(E, K, N): experts, in, out."""
    e, n, k = self.weight.shape
    return e, k, n


def scale_shape(num_experts: int, out: int, inner: int, blocks: bool) -> tuple[int, ...]:
  """The scale of E experts' [out, in] weights: [E, out] per channel, [E, out/128, in/128]."""
  if blocks:
    return (num_experts, out // pallas_fp8.BLOCK, inner // pallas_fp8.BLOCK)
  return (num_experts, out)


def quantize_experts(kernel: jax.Array, blocks: bool = False) -> Fp8Weights:
  """Float stacked experts, flax's [E, in, out] -> Fp8Weights ([E, out, in]): per channel, each
  expert's rows quantized as the dense W8A8 projections' (quantize.quantize_weight); `blocks`:
  per 128 x 128 block (out and in multiples of 128), scale = the block's largest magnitude / 448
  (times the float32 reciprocal: within an ulp of a true division) as block-wise fp8
  checkpoints store it."""
  if not blocks:
    fp8 = SCHEMES["fp8"]
    q, scale = jax.vmap(lambda w: quantize_weight(w.T.astype(jnp.float32), fp8))(kernel)
    return Fp8Weights(q, scale)
  b = pallas_fp8.BLOCK
  w = jnp.swapaxes(kernel, 1, 2).astype(jnp.float32)  # [E, out, in]
  e, out, inner = w.shape
  tiles_ = w.reshape(e, out // b, b, inner // b, b)
  amax = jnp.max(jnp.abs(tiles_), axis=(2, 4))  # [E, out/128, in/128]
  inverse = jnp.float32(1.0 / pallas_fp8.FP8_MAX)  # as XLA rewrites a division (quantize.py)
  scale = jnp.where(amax > 0, amax * inverse, 1.0).astype(jnp.float32)
  q = jnp.clip(tiles_ / scale[:, :, None, :, None], -pallas_fp8.FP8_MAX, pallas_fp8.FP8_MAX)
  return Fp8Weights(q.astype(jnp.float8_e4m3fn).reshape(e, out, inner), scale)


def _row_groups(group_sizes: jax.Array, num_rows: int) -> jax.Array:
  """int32[M]: each row's group (the last one past sum(group_sizes): those rows are unspecified)."""
  ends = jnp.cumsum(group_sizes.astype(jnp.int32))  # [G]
  groups = jnp.sum(ends[None, :] <= jnp.arange(num_rows, dtype=jnp.int32)[:, None], axis=1)
  return jnp.minimum(groups, group_sizes.shape[0] - 1)  # [M]


def _ragged_products(rows: jax.Array, w: jax.Array, scale: jax.Array, group_sizes) -> jax.Array:
  """float32 [M, N]: the W8A8 products on ragged_dot (module docstring)."""
  m, k = rows.shape
  blocks = scale.ndim == 3
  xq, x_scale = pallas_fp8.quantize_rows(rows, pallas_fp8.scale_group(scale.ndim, k))
  xq = xq.astype(jnp.bfloat16)  # [M, K], exact
  wt = jnp.swapaxes(w, 1, 2).astype(jnp.bfloat16)  # [E, K, N], exact
  sizes = group_sizes.astype(jnp.int32)
  groups = _row_groups(sizes, m)  # [M]
  if not blocks:
    acc = jax.lax.ragged_dot(xq, wt, sizes, preferred_element_type=jnp.float32)  # [M, N]
    return acc * x_scale * scale[groups]  # [M, N] * [M, 1] * [M, N]
  acc = jnp.zeros((m, w.shape[1]), jnp.float32)
  for kb in range(k // pallas_fp8.BLOCK):
    part = slice(kb * pallas_fp8.BLOCK, (kb + 1) * pallas_fp8.BLOCK)
    product = jax.lax.ragged_dot(
      xq[:, part], wt[:, part], sizes, preferred_element_type=jnp.float32
    )  # [M, N]
    w_scale = jnp.repeat(scale[groups, :, kb], pallas_fp8.BLOCK, axis=1)  # [M, N]
    acc = acc + product * x_scale[:, kb : kb + 1] * w_scale
  return acc


def _ragged_matmul(rows, weight, scale, group_sizes) -> jax.Array:
  return _ragged_products(rows, weight, scale, group_sizes).astype(rows.dtype)


def _ragged_swiglu(rows, gate, gate_scale, up, up_scale, group_sizes) -> jax.Array:
  g = _ragged_products(rows, gate, gate_scale, group_sizes)  # [M, N] float32
  u = _ragged_products(rows, up, up_scale, group_sizes)
  return (jax.nn.silu(g) * u).astype(rows.dtype)


def _fits(rows: jax.Array, w: Fp8Weights) -> bool:
  """Whether the Pallas kernel takes these shapes (else ragged_dot everywhere)."""
  e, k, n = w.dims
  return tiles.supports(rows.shape[0], k, n, e) and rows.dtype in pallas_fp8.ROW_DTYPES


def fp8_kernel_refused() -> bool:
  """Whether this process's device lacks what the fp8 kernel needs (a GPU without fp8 tensor
  cores: quantization/capabilities.py's rule), so that "auto" takes ragged_dot."""
  return refusal(SCHEMES["fp8"], DeviceDescription.of(jax.devices()[0])) is not None


def _dispatch(kernel: str, ragged, pallas, rows, operands: tuple, group_sizes):
  if kernel == "ragged_dot":
    return ragged(rows, *operands, group_sizes)
  if kernel == "pallas":
    interpret = jax.default_backend() != "gpu"
    return pallas(rows, *operands, group_sizes, interpret=interpret)
  if fp8_kernel_refused():
    return ragged(rows, *operands, group_sizes)  # a GPU without fp8 tensor cores
  return jax.lax.platform_dependent(rows, *operands, group_sizes, cuda=pallas, default=ragged)


def _check(rows: jax.Array, w: Fp8Weights, group_sizes: jax.Array) -> None:
  e, k, n = w.dims
  if rows.ndim != 2 or rows.shape[1] != k or w.weight.dtype != jnp.float8_e4m3fn:
    raise ValueError(
      f"rows/weights: expected [M, {k}] and float8_e4m3fn [E, N, {k}], got {rows.shape}, "
      f"{w.weight.dtype}{list(w.weight.shape)}"
    )
  if w.scale.shape not in ((e, n), (e, n // 128, k // 128)):
    raise ValueError(f"scale: expected [{e}, {n}] or [{e}, N/128, K/128], got {w.scale.shape}")
  if group_sizes.shape != (e,):
    raise ValueError(f"group_sizes: expected [{e}], got {group_sizes.shape}")


def fp8_grouped_matmul(
  rows: jax.Array, w: Fp8Weights, group_sizes: jax.Array, kernel: str = "auto"
) -> jax.Array:
  """rows [M, K] (sorted by group) times each group's fp8 weights -> [M, N] in rows' dtype (W8A8,
  module docstring); rows past sum(group_sizes) unspecified."""
  _check(rows, w, group_sizes)
  if kernel != "ragged_dot" and not _fits(rows, w):
    kernel = "ragged_dot"
  operands = (w.weight, w.scale)
  return _dispatch(
    kernel, _ragged_matmul, pallas_fp8.grouped_matmul_fp8, rows, operands, group_sizes
  )


def fp8_grouped_swiglu(
  rows: jax.Array, gate: Fp8Weights, up: Fp8Weights, group_sizes: jax.Array, kernel: str = "auto"
) -> jax.Array:
  """silu(rows @ gate) * (rows @ up) -> [M, N] in rows' dtype, each product as
  fp8_grouped_matmul's, in float32, rounded once."""
  _check(rows, gate, group_sizes)
  _check(rows, up, group_sizes)
  if kernel != "ragged_dot" and not _fits(rows, gate):
    kernel = "ragged_dot"
  operands = (gate.weight, gate.scale, up.weight, up.scale)
  return _dispatch(
    kernel, _ragged_swiglu, pallas_fp8.grouped_swiglu_fp8, rows, operands, group_sizes
  )


def fp8_routed_fits(x: jax.Array, gate: Fp8Weights, num_rows: int) -> bool:
  """Whether the routed fp8 kernels take M = num_rows assignments of x [T, H] over gate's
  [E, I, H] experts and the down product's [E, H, I]."""
  e, hidden, inner = gate.dims
  return (
    x.dtype in pallas_fp8.ROW_DTYPES
    and tiles.supports(num_rows, hidden, inner, e)
    and tiles.supports(num_rows, inner, hidden, e)
  )


def fp8_routed_swiglu_ffn(
  x: jax.Array,  # [T, H]
  gate: Fp8Weights,  # [E, I, H] e4m3 with scales
  up: Fp8Weights,  # like gate
  down: Fp8Weights,  # [E, H, I]
  routing: Routing,  # of the T * top_k assignments over the E experts
  top_k: int,
  route_weights: jax.Array,  # float32[M], assignment order
  *,
  interpret: bool = False,
) -> jax.Array:
  """-> [M, H] in x's dtype, assignment order: each assignment's routing-weighted expert FFN, the
  tokens gathered into the gate/up product and the outputs scattered from the down product
  (pallas_kernels/grouped_matmul/fp8_routed.py); the hidden rows [M, I] stay sorted between."""
  hidden = grouped_swiglu_fp8_gathered(
    x, gate.weight, gate.scale, up.weight, up.scale, routing, top_k, interpret=interpret
  )  # [M, I] sorted
  return grouped_matmul_fp8_scattered(
    hidden, down.weight, down.scale, routing, route_weights, interpret=interpret
  )
