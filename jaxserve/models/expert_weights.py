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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.models.leaf_load import LeafLoad, LeafOut, ParamPath, TensorLoad
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.tensor_spec import TensorSpec

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
