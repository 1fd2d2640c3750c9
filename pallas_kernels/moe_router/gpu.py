"""The top-k router for GPUs: softmax, top-k and renormalization of a step's expert logits as one
Pallas (Triton) kernel, where XLA runs a softmax fusion, a sort (its TopK) and a renormalizing
fusion per MoE layer.

Grid (T / block_t,): each program loads block_t tokens' logits [block_t, EP] (E padded to a
power of two with -inf), in float32: max, exp(x - max), its sum and the probabilities (as
jax.nn.softmax: exp(x - max) / sum); then K rounds of (largest probability, its lowest expert
id, that entry struck out), stored as column k of the outputs. Ties go to the lower expert id,
as lax.top_k. With `renormalize` the K probabilities are divided by their sum. The values match
reference.top_k_route_reference to float32 rounding (exp's own ulps may reorder near-ties).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.triton_params import triton_compiler_params

BLOCK_T = 16
MAX_EXPERTS = 1024
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def _kernel(logits_ref, weights_ref, ids_ref, *, top_k: int, experts_pad: int, renormalize: bool):
  num_tokens, num_experts = logits_ref.shape
  tokens = pl.program_id(0) * BLOCK_T + jnp.arange(BLOCK_T, dtype=jnp.int32)  # [BT]
  valid = tokens < num_tokens
  rows = jnp.where(valid, tokens, num_tokens)[:, None]  # [BT, 1] OOB when masked
  experts = jnp.arange(experts_pad, dtype=jnp.int32)[None, :]  # [1, EP]
  mask = valid[:, None] & (experts < num_experts)  # [BT, EP]
  x = plgpu.load(logits_ref.at[rows, experts], mask=mask, other=float("-inf"))
  x = x.astype(jnp.float32)  # [BT, EP]
  e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))  # [BT, EP]
  probs = e / jnp.sum(e, axis=1, keepdims=True)  # [BT, EP]
  picked, ids = [], []
  for _ in range(top_k):
    best = jnp.max(probs, axis=1)  # [BT]
    best_id = jnp.min(jnp.where(probs == best[:, None], experts, experts_pad), axis=1)  # [BT]
    probs = jnp.where(experts == best_id[:, None], -1.0, probs)  # struck out
    picked.append(best)
    ids.append(best_id)
  total = functools.reduce(jnp.add, picked)  # [BT]
  for k in range(top_k):
    weight = picked[k] / total if renormalize else picked[k]
    plgpu.store(weights_ref.at[rows[:, 0], k], weight, mask=valid)
    plgpu.store(ids_ref.at[rows[:, 0], k], ids[k], mask=valid)


@functools.partial(jax.jit, static_argnames=("top_k", "renormalize", "interpret"))
def _route(logits, *, top_k: int, renormalize: bool, interpret: bool):
  num_tokens, num_experts = logits.shape
  kernel = functools.partial(
    _kernel,
    top_k=top_k,
    experts_pad=max(16, pl.next_power_of_2(num_experts)),
    renormalize=renormalize,
  )
  return pl.pallas_call(
    kernel,
    grid=(pl.cdiv(num_tokens, BLOCK_T),),
    in_specs=[pl.no_block_spec],
    out_specs=[pl.no_block_spec] * 2,
    out_shape=[
      jax.ShapeDtypeStruct((num_tokens, top_k), jnp.float32),
      jax.ShapeDtypeStruct((num_tokens, top_k), jnp.int32),
    ],
    compiler_params=triton_compiler_params(4, 1),
    interpret=interpret,
    name="moe_router",
  )(logits)


def top_k_route(
  logits: jax.Array,  # [T, E] bfloat16, float16 or float32: each token's expert logits
  top_k: int,  # K <= E experts per token
  renormalize: bool,  # divide the K probabilities by their sum
  *,
  interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """-> (weights float32[T, K], expert_ids int32[T, K]): each token's K most probable experts,
  most probable first (module docstring)."""
  if logits.ndim != 2 or jnp.dtype(logits.dtype) not in DTYPES:
    raise ValueError(
      f"top_k_route: logits: expected [T, E] bfloat16, float16 or float32, "
      f"got {logits.dtype}{list(logits.shape)}"
    )
  num_tokens, num_experts = logits.shape
  if not 1 <= num_experts <= MAX_EXPERTS:
    raise ValueError(f"top_k_route: logits: expected 1..{MAX_EXPERTS} experts, got {num_experts}")
  if not 1 <= top_k <= num_experts:
    raise ValueError(f"top_k_route: top_k: expected 1..{num_experts}, got {top_k}")
  if num_tokens == 0:
    return jnp.zeros((0, top_k), jnp.float32), jnp.zeros((0, top_k), jnp.int32)
  return _route(logits, top_k=top_k, renormalize=renormalize, interpret=interpret)
