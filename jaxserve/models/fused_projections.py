"""Merged projections: q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj` GEMM.

Checkpoints (and the params tree of `weights.hf_tensor_specs`) keep HF's separate projections.
On one device they are merged while loading a safetensors checkpoint (weights.load_hf_weights
with `fuse`: the converted parts are concatenated in the same device program, so no separate
kernel ever sits in device memory), else once after loading (`fuse_params`, for built-in and
orbax weights). Both follow MERGED, the one table of what is merged. Each layer's q, k and v
kernels [H, Q*D], [H, K*D], [H, K*D] become one [H, (Q + 2K) * D] kernel (biases likewise), and
gate / up [H, I] one [H, 2I] kernel; a quantized projection's kernels are [out, in] and are
concatenated with their scales along axis 0 (models/quantized_dense.py, `output_axis`). The
model (ModelConfig.fused_projections) then runs one GEMM per group and splits its output, which
is exactly what the separate GEMMs compute, without XLA re-concatenating the weights inside every
step (its dot merger does that for q/k/v) and with one wider GEMM for gate/up. Sharded models
keep the separate projections: each device's shard of a merged kernel would not hold matching q,
k and v columns. A mixture of experts' layers keep their router and stacked experts as they are
(models/layers/moe.py); their q/k/v are merged like any other.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax.numpy as jnp

from jaxserve.models.quantized_dense import output_axis

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
# module -> (merged projection, the projections it replaces, in output-column order)
MERGED = {"self_attn": ("qkv_proj", QKV), "mlp": ("gate_up_proj", GATE_UP)}

ParamPath = tuple[str, ...]


def merged_leaves(paths: Iterable[ParamPath]) -> list[tuple[ParamPath, tuple[ParamPath, ...]]]:
  """The merged tree's leaves in the order of `paths` (a layer's merged leaf where its first
  part was), each with the leaves it concatenates along the output axis (one: kept as it is).
  Paths are (layer, module, projection, leaf) for the merged projections."""
  paths = list(paths)
  present = set(paths)
  out, seen = [], set()
  for path in paths:
    target, parts = path, (path,)
    if len(path) == 4 and path[1] in MERGED and path[2] in MERGED[path[1]][1]:
      merged, names = MERGED[path[1]]
      target = (path[0], path[1], merged, path[3])
      parts = tuple((path[0], path[1], name, path[3]) for name in names)
      missing = [part for part in parts if part not in present]
      if missing:
        raise ValueError(f"fused_projections: {target} needs {missing}")
    if target not in seen:
      seen.add(target)
      out.append((target, parts))
  return out


def _merge(module: dict, names: tuple[str, ...], merged: str) -> None:
  """Replaces module[names...] by module[merged], concatenated along the output axis."""
  parts = [module.pop(name) for name in names]
  axis = output_axis(parts[0])
  module[merged] = {leaf: jnp.concatenate([p[leaf] for p in parts], axis=axis) for leaf in parts[0]}


def fuse_params(params: dict) -> dict:
  """Merges every layer's q/k/v and gate/up, in place, and returns `params`. Each layer dict is
  replaced once merged, so when the caller holds the tree only through `params` the separate
  kernels of a layer are freed before the next layer is merged: fusing needs one layer's worth
  of extra device memory, not a second model."""
  for name in [name for name in params if name.startswith("layers_")]:
    layer = {key: dict(value) for key, value in params[name].items()}
    for module, (merged, names) in MERGED.items():
      if (
        names[0] in layer[module]
      ):  # a mixture of experts' mlp has no gate/up (models/layers/moe.py)
        _merge(layer[module], names, merged)
    params[name] = layer
  return params
