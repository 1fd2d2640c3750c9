"""What the weight loader asks the transfer for (models/weight_transfer.py): each params leaf as
the checkpoint tensors it is made of (LeafLoad: one tensor, the parts of a merged projection, or
the raw parts of a custom conversion such as a projection quantized as it loads) and, for a
custom conversion, the arrays it makes (LeafOut). Frozen records: nothing here touches a device."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np

from jaxserve.models.safetensors_reader import SafetensorsHeader, TensorInfo

ParamPath = tuple[str, ...]
# The target sharding of a params leaf from its path and final (flax) shape.
ShardingFn = Callable[[ParamPath, tuple[int, ...]], jax.sharding.Sharding]
Converter = Callable[..., jax.Array]  # the raw part(s) -> the leaf


@dataclass(frozen=True)
class TensorLoad:
  """One checkpoint tensor for a params leaf (or for one part of a merged leaf)."""

  path: ParamPath
  header: SafetensorsHeader
  info: TensorInfo
  transpose: bool  # HF [out, in] -> flax [in, out]

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(reversed(self.info.shape)) if self.transpose else self.info.shape


@dataclass(frozen=True)
class LeafOut:
  """One array a custom conversion makes: where it goes in the params tree, its shape, dtype."""

  path: ParamPath
  shape: tuple[int, ...]
  dtype: np.dtype


@dataclass(frozen=True)
class LeafLoad:
  """One params leaf: one checkpoint tensor, or the parts of a merged projection, concatenated
  along the output axis (HF's axis 0: the last once transposed) after each is converted.
  `convert` replaces that conversion (the raw parts in, on the device: e.g. a projection
  quantized as it loads) and makes `outputs` (one array, or a tuple of them in that order), each
  placed with its own target sharding when loading sharded."""

  path: ParamPath
  parts: tuple[TensorLoad, ...]
  convert: Converter | None = None
  outputs: tuple[LeafOut, ...] = ()

  @property
  def transpose(self) -> bool:
    return self.parts[0].transpose

  @property
  def shape(self) -> tuple[int, ...]:
    first = self.parts[0].info.shape
    stored = (sum(part.info.shape[0] for part in self.parts),) + tuple(first[1:])
    return tuple(reversed(stored)) if self.transpose else stored

  @property
  def raw_bytes(self) -> int:
    return sum(part.info.nbytes for part in self.parts)
