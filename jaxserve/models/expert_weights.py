"""A mixture-of-experts layer's tensors in a Hugging Face checkpoint, and their stacked loading.

Hub checkpoints (Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1) and what transformers 5's
`save_pretrained` writes (it converts its in-memory fused experts back to the original names)
store the router and one Linear [out, in] per expert and projection, under a module and with
projection names each family's module gives as its `ExpertNames` (models/families/qwen3_moe.py:
`mlp`, gate_proj / up_proj / down_proj; models/families/mixtral.py: `block_sparse_moe`, w1 / w3 /
w2):

  model.layers.{i}.{module}.gate.weight [E, H]
  model.layers.{i}.{module}.experts.{j}.{gate, up, down}.weight

The model stacks each projection's experts into one leaf [E, in, out] (models/layers/moe.py).
Loading puts the E raw tensors on the device(s) as they are on disk and transposes and stacks
them there in one jitted conversion per shape (weight_transfer's custom conversion, its output
placed with the leaf's target sharding). A checkpoint written with `save_pretrained(...,
save_original_format=False)` holds transformers' fused in-memory tensors
(`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) instead: a load error that
says so.

fp8 experts (ModelConfig.expert_quantization, models/moe_config.py) stack each projection's
experts as they are on disk, [E, out, in] e4m3, beside a float32 scale leaf
(`fp8_stacked_leaves`; the layout: models/fp8_experts.py), one conversion making both arrays:

  stored e4m3 with 128 x 128 block scales (block-wise fp8), kept as blocks: weights and
    weight_scale_inv stacked as they are
  stored e4m3 with per-channel or per-tensor scales (compressed-tensors), per channel: stacked,
    a tensor's one scale broadcast to its channels
  stored in a float type (a bf16 checkpoint with `--quantization fp8`), per channel: each
    expert quantized as the dense projections are (quantize.quantize_weight); in a block-wise
    fp8 checkpoint that leaves its experts unquantized (`modules_to_not_convert`), per block
  stored e4m3 with block scales but run per channel (sizes that are not blocks of 128):
    dequantized, then quantized per channel

A conversion's raw parts are each expert's weight followed by its scale where it has one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.models.dequantized_loading import PartKey, StoredScale, part_key
from jaxserve.models.fp8_experts import SCALE_SUFFIX, quantize_experts, scale_shape
from jaxserve.models.leaf_load import LeafLoad, LeafOut, ParamPath, TensorLoad
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.tensor_spec import TensorSpec
from jaxserve.quantization.dequantize import dequantize

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_FUSED_SUFFIXES = ("experts.gate_up_proj", "experts.down_proj")


@dataclass(frozen=True)
class ExpertNames:
  """A family's HF names for a MoE layer: the module holding the router and the experts, and
  each of PROJECTIONS' name in it."""

  module: str
  projections: Mapping[str, str]  # gate_proj / up_proj / down_proj -> the HF name

  def router(self, layer: int) -> str:
    """The router's HF tensor [E, H]."""
    return f"model.layers.{layer}.{self.module}.gate.weight"

  def expert(self, layer: int, expert: int, projection: str) -> str:
    """One expert's HF Linear weight for `projection` (one of PROJECTIONS)."""
    hf_projection = self.projections[projection]
    return f"model.layers.{layer}.{self.module}.experts.{expert}.{hf_projection}.weight"


def expert_specs(c: ModelConfig, layer: int, names: ExpertNames) -> list[TensorSpec]:
  """Layer `layer`'s router [H, E] and, expert by expert, its experts' projections (each the
  slice `expert` of a stacked leaf [E, in, out]; params in models/layers/moe.py)."""
  fx = f"layers_{layer}"
  h, i = c.hidden_size, c.moe_intermediate_size
  specs = [TensorSpec((fx, "mlp", "gate", "kernel"), names.router(layer), (c.num_experts, h), True)]
  hf_shapes = {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}  # [out, in]
  for j in range(c.num_experts):
    specs += [
      TensorSpec(
        (fx, "mlp", "experts", name), names.expert(layer, j, name), hf_shapes[name], True, j
      )
      for name in PROJECTIONS
    ]
  return specs


def check_per_expert_layout(tensor_names: Iterable[str], listing: Path) -> None:
  """ValueError when the checkpoint stores transformers' fused experts (module docstring)."""
  fused = next((name for name in tensor_names if name.endswith(_FUSED_SUFFIXES)), None)
  if fused is not None:
    raise ValueError(
      f"{listing}: tensor {fused!r} holds every expert fused (transformers' "
      "save_original_format=False); re-save with save_original_format=True, the per-expert "
      "layout of published checkpoints"
    )


def stacked_leaves(loads: Sequence[TensorLoad], dtype: np.dtype) -> list[LeafLoad]:
  """One leaf per stacked param: its experts' TensorLoads (in expert order, as planned), each
  [out, in] on disk, become one [E, in, out] array in `dtype` on the device."""
  groups: dict[ParamPath, list[TensorLoad]] = {}
  for load in loads:
    groups.setdefault(load.path, []).append(load)
  dtype = np.dtype(dtype)

  def stack(*raws: jax.Array) -> jax.Array:  # one function: one jit per shape and sharding
    return jnp.stack([raw.T for raw in raws]).astype(dtype)  # [E, in, out]

  return [
    LeafLoad(path, tuple(parts), stack, (LeafOut(path, (len(parts),) + parts[0].shape, dtype),))
    for path, parts in groups.items()
  ]


def fp8_scale_path(path: ParamPath) -> ParamPath:
  """The scale leaf beside fp8 experts' weight leaf: experts/<projection>_scale."""
  return path[:-1] + (path[-1] + SCALE_SUFFIX,)


def fp8_stacked_leaves(
  loads: Sequence[TensorLoad], scales: Mapping[PartKey, StoredScale], blocks: bool
) -> list[LeafLoad]:
  """One leaf per stacked projection making its fp8 weight [E, out, in] and scale ([E, out], or
  [E, out/128, in/128] with `blocks`) from its experts' TensorLoads (in expert order) and the
  stored scales of those stored in 8 bits (module docstring)."""
  groups: dict[ParamPath, list[TensorLoad]] = {}
  for load in loads:
    groups.setdefault(load.path, []).append(dataclasses.replace(load, transpose=False))
  leaves = []
  for path, experts in groups.items():
    found = [scales.get(part_key(load)) for load in experts]
    stored = [scale.block for scale in found if scale is not None]
    if stored and len(stored) != len(experts):
      raise ValueError(f"{experts[0].header.path}: {path}: some experts stored in 8 bits, some not")
    block = stored[0] if stored else None
    if blocks and block not in (None, (128, 128)):
      raise ValueError(
        f"{experts[0].header.path}: tensor {experts[0].info.name!r}: block-wise fp8 experts "
        f"need 128 x 128 block scales, got {list(block)}"
      )
    parts: list[TensorLoad] = []
    for load, scale in zip(experts, found, strict=True):
      parts += [load] if scale is None else [load, scale.load]
    out, inner = experts[0].info.shape
    shape = scale_shape(len(experts), out, inner, blocks)
    outputs = (
      LeafOut(path, (len(experts), out, inner), np.dtype(jnp.float8_e4m3fn)),
      LeafOut(fp8_scale_path(path), shape, np.dtype(np.float32)),
    )
    convert = _fp8_converter(block, blocks, out, inner)
    leaves.append(LeafLoad(path, tuple(parts), convert, outputs))
  return leaves


@functools.cache
def _fp8_converter(
  block: tuple[int, int] | None, blocks: bool, out: int, inner: int
) -> Callable[..., tuple[jax.Array, jax.Array]]:
  """The raw parts (weights, each followed by its stored scale if `block`) -> (e4m3 [E, out, in],
  float32 scale); one function per kind, so one jit per shape."""

  def convert(*raws: jax.Array) -> tuple[jax.Array, jax.Array]:
    if block is None:  # float experts, quantized per channel (or per block beside block ones)
      return _quantized(jnp.stack(raws), blocks)
    weights, stored = raws[0::2], raws[1::2]
    if blocks:
      return jnp.stack(weights), jnp.stack([s.astype(jnp.float32) for s in stored])
    if block[1] >= inner and block[0] in (1, out):  # per channel, or one scale per tensor
      per_channel = [jnp.broadcast_to(s.reshape(-1).astype(jnp.float32), (out,)) for s in stored]
      return jnp.stack(weights), jnp.stack(per_channel)
    floats = [dequantize(w, s, block) for w, s in zip(weights, stored, strict=True)]
    return _quantized(jnp.stack(floats))

  return convert


def _quantized(experts: jax.Array, blocks: bool = False) -> tuple[jax.Array, jax.Array]:
  """Float experts [E, out, in] -> (e4m3 [E, out, in], float32 scales), per channel [E, out] or
  per 128 x 128 block [E, out/128, in/128]."""
  q = quantize_experts(jnp.swapaxes(experts, 1, 2), blocks)  # takes flax's [E, in, out]
  return q.weight, q.scale
