"""Mixture-of-experts FFNs as grouped matmuls over the token assignments sorted by expert.

A step routes each of its T tokens to K experts (models/layers/moe.py). `expert_ffn` computes

  out[t] = sum_k weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = expert_ids[t, k]

without a dense all-experts product and without a per-expert loop: the T*K assignments are
sorted by expert id (stable), and every projection is one grouped matmul whose groups are the
experts' contiguous runs of sorted rows (`group_sizes`, length E); each row's result goes back to
its assignment, is weighted in float32, and each token sums its K results (a plain reduction, so
the sum over k has a fixed order). Two paths compute this:

  routed (CUDA)  pallas_kernels/grouped_matmul: the routing kernel (routing.py, a counting sort
                 that also maps the runs to the matmuls' row tiles), the gate/up product reading
                 each sorted row from its token (a gather inside the kernel, no copy of the rows)
                 and the down product writing each row to its assignment, times its routing
                 weight (a scatter store; every assignment written once, no atomics): three
                 Pallas calls and the sum over k (routed.routed_swiglu_ffn);
  sorted         `sort_by_expert` (jnp.argsort, bincount), the sorted rows copied (x[order // K]),
                 two grouped matmuls on them, the inverse permutation (a gather) and the weights.

Both round each product once to the rows' dtype (the routed path after the routing weight, the
sorted one before) and sum in float32.
Shapes are fixed by (T, K, E, H, I) alone: M = T*K rows whatever the routing, group sizes are
data, and an expert with no token is an empty group. A step therefore compiles once per token
bucket, like the dense model.

Expert parallelism (parallel/sharded_experts.py) calls `expert_ffn` on each device with that
device's E_local stacked experts and `first_expert`, its first expert's global id. Assignments
to other devices' experts are sorted after every local group (outside the ragged groups) and
contribute exactly zero, so the devices' float32 partials sum to the whole result.

The path (`kernel`, default "auto") is chosen where the program is lowered, by
`jax.lax.platform_dependent`: for CUDA GPUs the routed path, elsewhere the sorted one through
`jax.lax.ragged_dot`. XLA's GPU lowering of ragged_dot is dense (on an H100 it materializes every
group's product, bf16[65536, 128, 768] for an 8192-token prefill of Qwen3-30B-A3B, and reads a
batch-1 decode step's experts at 166 GB/s of ~2.9 TB/s), while the kernel's programs each read
their own group's weights only. On GPUs the gate and up projections are one kernel (two
accumulators, silu(gate) * up in float32, rounded once) that reads the rows once; ragged_dot
rounds each projection to the rows' dtype first. Shapes the kernel does not take (K or N not a
multiple of 16) keep ragged_dot. "ragged_dot" forces the sorted path through ragged_dot,
"pallas" the routed path and "pallas_sorted" the sorted path through the Pallas kernel (both in
Pallas interpret mode off GPUs: tests, and investigations/bench_grouped_matmul.py, which times
them against each other). `grouped_matmul` and `grouped_swiglu` dispatch the sorted products
alone the same way.

On TPU, XLA compiles ragged_dot to libtpu's own Mosaic kernels, a metadata kernel that tiles the
groups and a grouped matmul over row tiles (the design of JAX's megablox gmm;
tests/tpu_aot/test_v6e_moe_and_gemma.py), so no Pallas kernel of ours sits behind this function
there. On CPU JAX lowers ragged_dot to a masked dot over all E groups (correct, E times the FLOPs
of the grouped product), which the CPU tests of tiny models can afford.

Float experts take the rows' dtype (bfloat16, float16 or float32). fp8 experts
(models/moe_config.py's expert_quantization) come as models/fp8_experts.Fp8Weights ([E, N, K]
e4m3 with per-channel or 128 x 128 block scales) and run the W8A8 fp8 grouped matmuls there,
with the same `kernel` choice: on CUDA GPUs with fp8 tensor cores the routed path through the fp8
kernel (the tokens quantized, then gathered; pallas_kernels/grouped_matmul/fp8_routed.py), on
others and off GPUs the sorted path on ragged_dot's exact fp8 values, "pallas_sorted" the sorted
path through the fp8 kernel; `expert_ffn` takes either kind, all three projections alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp

from jaxserve.models.fp8_experts import (
  Fp8Weights,
  fp8_grouped_matmul,
  fp8_grouped_swiglu,
  fp8_kernel_refused,
  fp8_routed_fits,
  fp8_routed_swiglu_ffn,
)
from pallas_kernels.grouped_matmul import gpu as pallas_gmm
from pallas_kernels.grouped_matmul.routed import routed_swiglu_ffn
from pallas_kernels.grouped_matmul.routing import route_assignments
from pallas_kernels.grouped_matmul.tiles import default_block_m

Kernel = Literal["auto", "ragged_dot", "pallas", "pallas_sorted"]
KERNELS = ("auto", "ragged_dot", "pallas", "pallas_sorted")
ExpertWeights = jax.Array | Fp8Weights  # float [E, K, N], or fp8 [E, N, K] with scales


def _ragged_matmul(rows: jax.Array, weights: jax.Array, group_sizes: jax.Array) -> jax.Array:
  return jax.lax.ragged_dot(rows, weights, group_sizes.astype(jnp.int32))  # [M, N]


def _ragged_swiglu(rows, gate, up, group_sizes) -> jax.Array:
  return jax.nn.silu(_ragged_matmul(rows, gate, group_sizes)) * _ragged_matmul(
    rows, up, group_sizes
  )  # [M, N]


def _dispatch(kernel: Kernel, ragged: Callable, pallas: Callable, rows, weights, *rest):
  """ragged(rows, weights, *rest) or pallas(...) by `kernel` (module docstring)."""
  _check_kernel(kernel)
  (m, k), (groups, _, n) = rows.shape, weights.shape
  fits = pallas_gmm.supports(m, k, n, groups) and rows.dtype == weights.dtype
  if kernel == "ragged_dot" or not (fits and jnp.dtype(rows.dtype) in pallas_gmm.DTYPES):
    return ragged(rows, weights, *rest)
  if kernel in ("pallas", "pallas_sorted"):
    return pallas(rows, weights, *rest, interpret=jax.default_backend() != "gpu")
  return jax.lax.platform_dependent(rows, weights, *rest, cuda=pallas, default=ragged)


def _check(rows: jax.Array, weights: jax.Array, group_sizes: jax.Array) -> None:
  if rows.ndim != 2 or weights.ndim != 3 or rows.shape[1] != weights.shape[1]:
    raise ValueError(
      f"rows/weights: expected [M, K] and [G, K, N], got {rows.shape}, {weights.shape}"
    )
  if group_sizes.shape != (weights.shape[0],):
    raise ValueError(f"group_sizes: expected [{weights.shape[0]}], got {group_sizes.shape}")


def _check_kernel(kernel: Kernel) -> None:
  if kernel not in KERNELS:
    raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")


def grouped_matmul(
  rows: jax.Array, weights: ExpertWeights, group_sizes: jax.Array, kernel: Kernel = "auto"
) -> jax.Array:
  """rows [M, K] (sorted by group) @ weights [G, K, N] -> [M, N] in rows' dtype: row m is
  multiplied by the weights of the group whose run holds it (group g owns the group_sizes[g]
  rows after those of groups < g). Rows past sum(group_sizes) are unspecified (zero from the
  Pallas kernel). Fp8Weights: W8A8 (models/fp8_experts.py)."""
  if isinstance(weights, Fp8Weights):
    _check_kernel(kernel)
    return fp8_grouped_matmul(rows, weights, group_sizes, kernel)
  _check(rows, weights, group_sizes)
  return _dispatch(kernel, _ragged_matmul, pallas_gmm.grouped_matmul, rows, weights, group_sizes)


def grouped_swiglu(
  rows: jax.Array,
  gate: ExpertWeights,
  up: ExpertWeights,
  group_sizes: jax.Array,
  kernel: Kernel = "auto",
) -> jax.Array:
  """silu(rows @ gate) * (rows @ up) -> [M, I] in rows' dtype, each product grouped as in
  grouped_matmul (gate, up [G, K, I], or both Fp8Weights)."""
  if isinstance(gate, Fp8Weights):
    _check_kernel(kernel)
    return fp8_grouped_swiglu(rows, gate, up, group_sizes, kernel)
  _check(rows, gate, group_sizes)
  if up.shape != gate.shape:
    raise ValueError(f"up: expected {gate.shape} like gate, got {up.shape}")
  return _dispatch(kernel, _ragged_swiglu, pallas_gmm.grouped_swiglu, rows, gate, up, group_sizes)


def expert_dims(w: ExpertWeights) -> tuple[int, int, int]:
  """(E, in, out) of stacked experts, float [E, in, out] or Fp8Weights ([E, out, in])."""
  return w.dims if isinstance(w, Fp8Weights) else tuple(w.shape)


def sort_by_expert(
  expert_ids: jax.Array, num_local: int, first_expert: jax.Array | int = 0
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """expert_ids [T, K] -> (order [M], local [M], group_sizes [num_local]), M = T*K.

  order[r] is the flat assignment (t*K + k) of sorted row r: the local experts' assignments by
  expert id (stable), then every other one. local[a]: assignment a goes to one of the
  num_local experts first_expert .. first_expert + num_local - 1."""
  flat = expert_ids.reshape(-1) - first_expert  # [M] local expert ids
  local = (flat >= 0) & (flat < num_local)  # [M]
  key = jnp.where(local, flat, num_local)  # [M] non-local assignments sort last
  order = jnp.argsort(key, stable=True)  # [M]
  group_sizes = jnp.bincount(key, length=num_local).astype(jnp.int32)  # [num_local]
  return order, local, group_sizes


def _sorted_ffn(x, expert_ids, weights, gate, up, down, first_expert, *, kernel: Kernel):
  """expert_ffn through a sort by expert, a copy of the sorted rows, the two grouped products
  (`kernel`'s) and the inverse permutation."""
  num_tokens, top_k = expert_ids.shape
  order, local, group_sizes = sort_by_expert(expert_ids, expert_dims(gate)[0], first_expert)
  rows = x[order // top_k]  # [M, H] each sorted assignment's token
  hidden_rows = grouped_swiglu(rows, gate, up, group_sizes, kernel)  # [M, I]
  out = grouped_matmul(hidden_rows, down, group_sizes, kernel)  # [M, H] sorted
  num_rows = order.shape[0]
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(num_rows, dtype=order.dtype))  # [M]
  out = out[inverse].astype(jnp.float32)  # [M, H] in assignment order
  scale = jnp.where(local, weights.reshape(-1).astype(jnp.float32), 0.0)  # [M]
  out = jnp.where(local[:, None], out, 0.0) * scale[:, None]  # [M, H]
  return out.reshape(num_tokens, top_k, -1).sum(axis=1)  # [T, H]


def _routed_ffn(x, expert_ids, weights, gate, up, down, first_expert, *, interpret: bool):
  """expert_ffn through the routing kernel and the routed products (module docstring)."""
  num_tokens, top_k = expert_ids.shape
  num_local = expert_dims(gate)[0]
  block_m = default_block_m(num_tokens * top_k, num_local)
  routing = route_assignments(expert_ids, num_local, block_m, first_expert, interpret=interpret)
  route_weights = weights.reshape(-1).astype(jnp.float32)  # [M] assignment order
  ffn = fp8_routed_swiglu_ffn if isinstance(gate, Fp8Weights) else routed_swiglu_ffn
  out = ffn(x, gate, up, down, routing, top_k, route_weights, interpret=interpret)  # [M, H]
  return out.astype(jnp.float32).reshape(num_tokens, top_k, -1).sum(axis=1)  # [T, H]


def _fp8_ffn(operands: tuple, kernel: Kernel) -> jax.Array:
  """expert_ffn of fp8 experts: the routed fp8 kernels on CUDA GPUs with fp8 tensor cores, the
  sorted path elsewhere (its products ragged_dot's, or the fp8 kernel's for "pallas_sorted")."""
  x, expert_ids, gate = operands[0], operands[1], operands[3]
  fits = x.shape[0] > 0 and fp8_routed_fits(x, gate, expert_ids.size)
  if kernel == "pallas_sorted" or (kernel == "pallas" and not fits):
    return _sorted_ffn(*operands, kernel="pallas")
  if kernel == "ragged_dot" or not fits:
    return _sorted_ffn(*operands, kernel=kernel)
  if kernel == "pallas":
    return _routed_ffn(*operands, interpret=jax.default_backend() != "gpu")
  ragged = functools.partial(_sorted_ffn, kernel="ragged_dot")
  if fp8_kernel_refused():
    return ragged(*operands)  # a GPU without fp8 tensor cores
  routed = functools.partial(_routed_ffn, interpret=False)
  return jax.lax.platform_dependent(*operands, cuda=routed, default=ragged)


def _routed_fits(x, gate, down, num_rows: int) -> bool:
  (num_local, hidden, inner), dtype = gate.shape, jnp.dtype(x.dtype)
  return (
    dtype in pallas_gmm.DTYPES
    and gate.dtype == down.dtype == dtype
    and pallas_gmm.supports(num_rows, hidden, inner, num_local)
    and pallas_gmm.supports(num_rows, inner, hidden, num_local)
  )


def expert_ffn(
  x: jax.Array,
  expert_ids: jax.Array,
  weights: jax.Array,
  gate: ExpertWeights,
  up: ExpertWeights,
  down: ExpertWeights,
  first_expert: jax.Array | int = 0,
  *,
  kernel: Kernel = "auto",
) -> jax.Array:
  """x [T, H], expert_ids int32[T, K], weights float32[T, K], gate/up [E, H, I], down [E, I, H]
  (or Fp8Weights of [E, I, H] and [E, H, I]) -> float32 [T, H]: the routing-weighted sum of each
  token's experts' SwiGLU FFNs, over the assignments to experts first_expert .. first_expert +
  E - 1 (the others add zero). kernel: the path (module docstring)."""
  num_tokens, top_k = expert_ids.shape
  num_local, hidden, inter = expert_dims(gate)
  if x.shape != (num_tokens, hidden) or weights.shape != expert_ids.shape:
    raise ValueError(
      f"x/weights: expected [{num_tokens}, {hidden}] and {expert_ids.shape}, "
      f"got {x.shape}, {weights.shape}"
    )
  kinds = {type(w) for w in (gate, up, down)}
  down_dims = (num_local, inter, hidden)
  if len(kinds) > 1 or expert_dims(up) != expert_dims(gate) or expert_dims(down) != down_dims:
    raise ValueError(
      f"up/down: {expert_dims(up)}, {expert_dims(down)} (E, in, out) do not match gate "
      f"{expert_dims(gate)}, or mix float and fp8 experts"
    )
  if kernel not in KERNELS:
    raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
  operands = (x, expert_ids, weights, gate, up, down, jnp.asarray(first_expert, jnp.int32))
  if isinstance(gate, Fp8Weights):
    return _fp8_ffn(operands, kernel)
  fits = num_tokens > 0 and _routed_fits(x, gate, down, num_tokens * top_k)
  if kernel == "pallas_sorted" or (kernel == "pallas" and not fits):
    return _sorted_ffn(*operands, kernel="pallas")
  ragged = functools.partial(_sorted_ffn, kernel="ragged_dot")
  if kernel == "ragged_dot" or not fits:
    return ragged(*operands)
  if kernel == "pallas":
    return _routed_ffn(*operands, interpret=jax.default_backend() != "gpu")
  routed = functools.partial(_routed_ffn, interpret=False)
  return jax.lax.platform_dependent(*operands, cuda=routed, default=ragged)
