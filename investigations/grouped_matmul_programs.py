"""The programs investigations/bench_grouped_matmul.py times: each column's function over a layer's
experts (bfloat16 arrays, or models/fp8_experts.Fp8Weights), jitted once per function or tiling
and run over every layer copy in one program, and the tiling strings its sweeps parse.

  ffn_program(fn)        fn(x, ids, weights, gate, up, down) over each layer: the grouped FFNs
                         (expert_ffn and its kernel choices) and the two dense references
  sorted_rows            the assignments' rows sorted by expert and the group sizes, per layer
  gate_program(kernel)   the gate product alone on the sorted rows (ragged_dot or Pallas)
  tiled_programs(t)      the gate product and the fused gate/up SwiGLU through the kernel at t
  routed_program(pair)   the routed FFN (routing kernel, gathered and scattered products) at a
                         (gate/up, down) tiling pair, on bfloat16 or fp8 experts

Off GPUs the Pallas kernels run in interpret mode.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxserve.models.fp8_experts import Fp8Weights
from jaxserve.models.grouped_matmul import expert_ffn, grouped_matmul, sort_by_expert
from pallas_kernels.grouped_matmul import fp8 as pallas_fp8
from pallas_kernels.grouped_matmul import gpu as pallas_gmm
from pallas_kernels.grouped_matmul.fp8_routed import (
  grouped_matmul_fp8_scattered,
  grouped_swiglu_fp8_gathered,
)
from pallas_kernels.grouped_matmul.routed import routed_swiglu_ffn
from pallas_kernels.grouped_matmul.routing import route_assignments


def dense_all(x, ids, weights, gate, up, down) -> jax.Array:
  """Every token through every expert [T, E, ...], weighted by its routing (zero elsewhere)."""
  hidden = jax.nn.silu(jnp.einsum("th,ehi->tei", x, gate)) * jnp.einsum("th,ehi->tei", x, up)
  out = jnp.einsum("tei,eih->teh", hidden, down).astype(jnp.float32)  # [T, E, H]
  dense_weights = jnp.zeros(out.shape[:2], jnp.float32)
  dense_weights = jax.vmap(lambda d, i, w: d.at[i].set(w))(dense_weights, ids, weights)  # [T, E]
  return jnp.einsum("teh,te->th", out, dense_weights)


def per_token_gather(x, ids, weights, gate, up, down) -> jax.Array:
  """Each assignment's expert weights gathered [T, K, H, I] and applied to its token."""
  hidden = jax.nn.silu(jnp.einsum("th,tkhi->tki", x, gate[ids])) * jnp.einsum(
    "th,tkhi->tki", x, up[ids]
  )  # [T, K, I]
  out = jnp.einsum("tki,tkih->tkh", hidden, down[ids]).astype(jnp.float32)  # [T, K, H]
  return jnp.einsum("tkh,tk->th", out, weights)


@functools.cache
def ffn_program(fn):
  def run(x, ids, weights, experts):
    return [fn(x, ids[layer], weights[layer], *w) for layer, w in enumerate(experts)]

  return jax.jit(run)


@functools.partial(jax.jit, static_argnames=("num_experts",))
def sorted_rows(x: jax.Array, ids: jax.Array, num_experts: int) -> tuple[list, list]:
  """Per layer, the assignments' rows sorted by expert [T*K, H] and the group sizes [E] (one
  program)."""
  rows, sizes = [], []
  for layer_ids in ids:
    order, _, group_sizes = sort_by_expert(layer_ids, num_experts)
    rows.append(x[order // layer_ids.shape[-1]])
    sizes.append(group_sizes)
  return rows, sizes


@functools.cache
def gate_program(kernel: str):
  """The gate projection of every layer on its sorted rows, through `kernel`."""

  def run(rows, sizes, experts):
    return [
      grouped_matmul(r, gate, n, kernel)
      for r, n, (gate, _, _) in zip(rows, sizes, experts, strict=True)
    ]

  return jax.jit(run)


@functools.cache
def tiled_programs(tiling: pallas_gmm.Tiling) -> dict:
  """The gate product and the fused gate/up SwiGLU of every layer through the kernel with
  `tiling` (interpret mode off GPUs)."""
  interpret = jax.default_backend() != "gpu"

  def matmul(r, g, n):
    if isinstance(g, Fp8Weights):
      return pallas_fp8.grouped_matmul_fp8(
        r, g.weight, g.scale, n, tiling=tiling, interpret=interpret
      )
    return pallas_gmm.grouped_matmul(r, g, n, tiling=tiling, interpret=interpret)

  def gated(r, g, u, n):
    if isinstance(g, Fp8Weights):
      return pallas_fp8.grouped_swiglu_fp8(
        r, g.weight, g.scale, u.weight, u.scale, n, tiling=tiling, interpret=interpret
      )
    return pallas_gmm.grouped_swiglu(r, g, u, n, tiling=tiling, interpret=interpret)

  def gate(rows, sizes, experts):
    return [matmul(r, g, n) for r, n, (g, _, _) in zip(rows, sizes, experts, strict=True)]

  def swiglu(rows, sizes, experts):
    return [gated(r, g, u, n) for r, n, (g, u, _) in zip(rows, sizes, experts, strict=True)]

  return {"gate": (jax.jit(gate), 1), "swiglu": (jax.jit(swiglu), 2)}


def parse_tilings(text: str) -> list[pallas_gmm.Tiling]:  # the fp8 kernel's Tiling is the same
  """ "BM,BN,BK,S,W,P;..." -> Tilings."""
  return [pallas_gmm.Tiling(*(int(v) for v in t.split(","))) for t in text.split(";") if t]


def parse_ffn_tilings(text: str) -> list[tuple[pallas_gmm.Tiling, pallas_gmm.Tiling]]:
  """ "GATE_UP/DOWN;..." (each "BM,BN,BK,S,W,P", one block_m) -> (gate/up, down) Tiling pairs."""
  pairs = []
  for pair in filter(None, text.split(";")):
    gate_up, down = (parse_tilings(t)[0] for t in pair.split("/"))
    pairs.append((gate_up, down))
  return pairs


@functools.cache
def routed_program(tilings: tuple[pallas_gmm.Tiling, pallas_gmm.Tiling]):
  """The routed FFN (routing kernel, gathered and scattered products) with the given tilings, on
  bfloat16 experts (routed.py) or fp8 ones (fp8_routed.py, the hidden rows an array between)."""
  interpret = jax.default_backend() != "gpu"

  def ffn(x, ids, weights, gate, up, down):
    tokens, top_k = ids.shape
    fp8 = isinstance(gate, Fp8Weights)
    groups = (gate.weight if fp8 else gate).shape[0]
    routing = route_assignments(ids, groups, tilings[0].block_m, interpret=interpret)
    route_w = weights.reshape(-1).astype(jnp.float32)
    if fp8:
      hidden = grouped_swiglu_fp8_gathered(
        x,
        gate.weight,
        gate.scale,
        up.weight,
        up.scale,
        routing,
        top_k,
        tiling=tilings[0],
        interpret=interpret,
      )  # [M, I] sorted
      out = grouped_matmul_fp8_scattered(
        hidden, down.weight, down.scale, routing, route_w, tiling=tilings[1], interpret=interpret
      )
    else:
      out = routed_swiglu_ffn(
        x, gate, up, down, routing, top_k, route_w, tilings=tilings, interpret=interpret
      )
    return out.astype(jnp.float32).reshape(tokens, top_k, -1).sum(axis=1)

  return ffn_program(ffn)


def tiling_label(t: pallas_gmm.Tiling) -> str:
  return f"{t.block_m}x{t.block_n}x{t.block_k}/{t.num_splits} w{t.num_warps} s{t.num_stages}"


def ffn_ragged(x, ids, weights, gate, up, down) -> jax.Array:
  return expert_ffn(x, ids, weights, gate, up, down, kernel="ragged_dot")


def ffn_routed(x, ids, weights, gate, up, down) -> jax.Array:
  return expert_ffn(x, ids, weights, gate, up, down, kernel="pallas")


def ffn_sorted(x, ids, weights, gate, up, down) -> jax.Array:
  return expert_ffn(x, ids, weights, gate, up, down, kernel="pallas_sorted")
