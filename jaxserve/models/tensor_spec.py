"""One params leaf's counterpart in a Hugging Face checkpoint: the row type of the conversion table
(models/weights.py `hf_tensor_specs`)."""

from __future__ import annotations

from dataclasses import dataclass

from jaxserve.models.leaf_load import ParamPath


@dataclass(frozen=True)
class TensorSpec:
  """One params leaf: where it lives in the flax tree and in the HF checkpoint."""

  path: ParamPath
  hf_name: str
  hf_shape: tuple[int, ...]
  # HF Linear weight [out, in] -> flax kernel [in, out]; a quantized kernel stays [out, in]
  # (quantized_loading.quantized_leaves drops the transpose)
  transpose: bool
  expert: int | None = None  # this tensor is slice `expert` (axis 0) of a stacked experts' leaf

  @property
  def shape(self) -> tuple[int, ...]:
    """The converted tensor's shape (a stacked leaf's is [E] + this)."""
    return tuple(reversed(self.hf_shape)) if self.transpose else self.hf_shape
