"""The sparse mixture-of-experts MLP of Qwen3-MoE and Mixtral, in Flax linen.

Routing follows transformers (modeling_qwen3_moe.py, modeling_mixtral.py): the router `gate`, a
bias-free Linear in the param dtype, gives logits [T, E]; their softmax in float32 gives each
expert's probability; each token keeps its top `num_experts_per_tok`, renormalized to sum to one
when `norm_topk_prob` (Qwen3-MoE's switch; always for Mixtral, whose softmax over the top-k logits
is the same); on CUDA GPUs these are one Pallas kernel (pallas_kernels/moe_router/). The chosen
experts' SwiGLU FFNs are computed as grouped matmuls over the assignments sorted by expert
(models/grouped_matmul.py) and summed with the routing weights in float32, then cast to the
param dtype (transformers multiplies and sums in the param dtype;
identical in float32, within bfloat16 rounding otherwise).

The experts' computation is injected (`experts`, an ExpertsFn): the unsharded model runs
grouped_matmul.expert_ffn; a sharded engine passes parallel/sharded_experts.py's, which runs the
same function on each device's slice of the experts. The module holds no sharding.

Params, with E experts, H hidden and I the experts' intermediate size:
  gate/kernel [H, E]
  experts/gate_proj [E, H, I]   experts/up_proj [E, H, I]   experts/down_proj [E, I, H]

With fp8 experts (ModelConfig.expert_quantization, models/moe_config.py) each projection is
float8_e4m3fn [E, out, in] beside its float32 scale (models/fp8_experts.py), per channel or per
128 x 128 block:
  experts/gate_proj, up_proj [E, I, H]   experts/gate_proj_scale, up_proj_scale [E, I] or
                                         [E, I/128, H/128]
  experts/down_proj [E, H, I]            experts/down_proj_scale [E, H] or [E, H/128, I/128]

With `tp_invariant_reductions` the router's GEMM is fenced off by optimization barriers (its
weights are replicated, so every layout runs the same GEMM) and the placement injects experts that
mirror a two-device layout (models/invariant_experts.py).

`batch_invariant` is refused for MoE models (models/moe_config.py): the router and the grouped
matmuls do not run through the fixed-tile GEMMs, so a token's bits are not guaranteed to be
independent of the other rows of its step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxserve.models.fp8_experts import SCALE_SUFFIX, Fp8Weights, scale_shape
from jaxserve.models.grouped_matmul import expert_ffn
from jaxserve.models.model_config import ModelConfig
from pallas_kernels.moe_router import gpu as router_gpu
from pallas_kernels.moe_router.reference import top_k_route_reference

# (x [T, H], expert_ids int32[T, K], weights float32[T, K], gate, up [E, H, I], down [E, I, H]
#   (or their Fp8Weights)) -> float32 [T, H]
ExpertsFn = Callable[..., jax.Array]


def route(logits: jax.Array, top_k: int, renormalize: bool) -> tuple[jax.Array, jax.Array]:
  """Router logits [T, E] -> (weights float32[T, K], expert_ids int32[T, K]): the top-k softmax
  probabilities (float32), renormalized to sum to one when `renormalize`. Lowered for CUDA GPUs
  it is one Pallas kernel (pallas_kernels/moe_router/gpu.py), elsewhere XLA's softmax and
  top_k (its reference)."""
  xla = functools.partial(top_k_route_reference, top_k=top_k, renormalize=renormalize)
  if logits.shape[0] == 0 or jnp.dtype(logits.dtype) not in router_gpu.DTYPES:
    return xla(logits)
  if not 1 <= top_k <= logits.shape[1] <= router_gpu.MAX_EXPERTS:
    return xla(logits)
  pallas = functools.partial(router_gpu.top_k_route, top_k=top_k, renormalize=renormalize)
  return jax.lax.platform_dependent(logits, cuda=pallas, default=xla)


class Experts(nn.Module):
  """The stacked experts' weights and their FFN over the routed tokens."""

  config: ModelConfig
  experts: ExpertsFn | None = None

  @nn.compact
  def __call__(self, x: jax.Array, expert_ids: jax.Array, weights: jax.Array) -> jax.Array:
    cfg = self.config
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    if cfg.expert_quantization == "none":
      dtype, init = jnp.dtype(cfg.dtype), nn.initializers.normal(0.02)
      gate = self.param("gate_proj", init, (e, h, i), dtype)  # [E, H, I]
      up = self.param("up_proj", init, (e, h, i), dtype)  # [E, H, I]
      down = self.param("down_proj", init, (e, i, h), dtype)  # [E, I, H]
    else:
      gate, up = self._fp8("gate_proj", i, h), self._fp8("up_proj", i, h)  # [E, I, H]
      down = self._fp8("down_proj", h, i)  # [E, H, I]
    run = self.experts if self.experts is not None else expert_ffn
    return run(x, expert_ids, weights, gate, up, down)  # float32 [T, H]

  def _fp8(self, name: str, out: int, inner: int) -> Fp8Weights:
    """One projection's fp8 experts [E, out, in] and scales (random at init: N(0, 1) e4m3 values
    times 0.02)."""
    cfg = self.config
    blocks = cfg.expert_quantization == "fp8_block"

    def init_weight(key, shape):
      return jax.random.normal(key, shape, jnp.float32).astype(jnp.float8_e4m3fn)

    weight = self.param(name, init_weight, (cfg.num_experts, out, inner))
    shape = scale_shape(cfg.num_experts, out, inner, blocks)
    scale = self.param(name + SCALE_SUFFIX, lambda _, s: jnp.full(s, 0.02, jnp.float32), shape)
    return Fp8Weights(weight, scale)


class SparseMoeBlock(nn.Module):
  """x [T, H] -> [T, H]: each token through its routed experts, weighted."""

  config: ModelConfig
  experts: ExpertsFn | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    router = nn.Dense(cfg.num_experts, use_bias=False, dtype=dtype, param_dtype=dtype, name="gate")
    if cfg.tp_invariant_reductions:  # the router's GEMM alone, as in every layout
      logits = jax.lax.optimization_barrier(router(jax.lax.optimization_barrier(x)))  # [T, E]
    else:
      logits = router(x)  # [T, E]
    weights, expert_ids = route(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob)  # [T, K]
    out = Experts(cfg, self.experts, name="experts")(x, expert_ids, weights)  # float32 [T, H]
    return out.astype(dtype)
