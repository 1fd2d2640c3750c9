"""Merged projections: q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj` GEMM.

Checkpoints (and the params tree of `weights.hf_tensor_specs`) keep HF's separate projections.
On one device the engine fuses them once after loading (`fuse_params`): each layer's q, k and v
kernels [H, Q*D], [H, K*D], [H, K*D] become one [H, (Q + 2K) * D] kernel (biases likewise), and
gate / up [H, I] one [H, 2I] kernel. The model (ModelConfig.fused_projections) then runs one
GEMM per group and splits its output, which is exactly what the separate GEMMs compute, without
XLA re-concatenating the weights inside every step (its dot merger does that for q/k/v) and with
one wider GEMM for gate/up. Sharded models keep the separate projections: each device's shard of
a merged kernel would not hold matching q, k and v columns.
"""
from __future__ import annotations

import jax.numpy as jnp

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


def _merge(module: dict, names: tuple[str, ...], merged: str) -> None:
  """Replaces module[names...] by module[merged], concatenated along the output axis."""
  parts = [module.pop(name) for name in names]
  module[merged] = {leaf: jnp.concatenate([p[leaf] for p in parts], axis=-1)
                    for leaf in parts[0]}


def fuse_params(params: dict) -> dict:
  """Merges every layer's q/k/v and gate/up, in place, and returns `params`. Each layer dict is
  replaced once merged, so when the caller holds the tree only through `params` the separate
  kernels of a layer are freed before the next layer is merged: fusing needs one layer's worth
  of extra device memory, not a second model."""
  for name in [name for name in params if name.startswith("layers_")]:
    layer = {key: dict(value) for key, value in params[name].items()}
    _merge(layer["self_attn"], QKV, "qkv_proj")
    _merge(layer["mlp"], GATE_UP, "gate_up_proj")
    params[name] = layer
  return params
