"""Stored 8-bit weights loaded as floats: each weight that a checkpoint stores quantized and the
model keeps in a float layout (every Linear of a block-wise fp8 checkpoint,
jaxserve/quantization/block_fp8.py; the MoE experts of a compressed-tensors one) is loaded with
its scale tensor and dequantized on the device (jaxserve/quantization/dequantize.py) before the
leaf's own conversion runs on it: the transpose and cast of a float kernel, the stacking of
experts (models/expert_weights.py), or the per-channel quantizer of a quantized projection
(models/quantized_loading.py: `--quantization` re-quantizes the dequantized weight).

`plan_block_scales` and `plan_channel_scales` find and check the scales from the headers before
any weight is read: every e4m3 weight among the planned tensors of a block-wise fp8 checkpoint
needs its `weight_scale_inv` of the block grid's shape, every 8-bit expert or router of a
compressed-tensors one its `weight_scale` ([out, 1] / [out] per channel, [1] / [] per tensor),
else a ValueError names the tensor. `dequantized_leaves` then rewrites the leaves whose
parts are such weights: each weight part followed by its scale, one jitted conversion per kind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import numpy as np

from jaxserve.models.leaf_load import LeafLoad, LeafOut, TensorLoad
from jaxserve.models.quantized_dense import is_quantized_kernel
from jaxserve.models.transfer_jobs import float_converter
from jaxserve.quantization.block_fp8 import SCALE_SUFFIX, WEIGHT_DTYPE, BlockFp8
from jaxserve.quantization.compressed_tensors import SCALE_SUFFIX as CT_SCALE_SUFFIX
from jaxserve.quantization.compressed_tensors import StoredQuantization
from jaxserve.quantization.dequantize import dequantize

SCALE_DTYPES = (np.dtype(np.float32), np.dtype(jax.numpy.bfloat16))
PartKey = tuple[str, str]  # (file, tensor name): a TensorLoad's identity


@dataclass(frozen=True)
class StoredScale:
  """A stored weight's scale tensor and the block of the weight each of its values covers."""

  load: TensorLoad
  block: tuple[int, int]


def part_key(load: TensorLoad) -> PartKey:
  return (str(load.header.path), load.info.name)


def plan_block_scales(
  index, loads: Sequence[TensorLoad], fmt: BlockFp8
) -> dict[PartKey, StoredScale]:
  """The scale of every e4m3 weight among `loads` of a block-wise fp8 checkpoint, checked
  (presence, shape, dtype). `index`: weights.TensorIndex."""
  weight_dtype = np.dtype(jax.numpy.dtype(WEIGHT_DTYPE))
  scales = {}
  for load in loads:
    if load.info.dtype != weight_dtype:
      continue
    name = load.info.name.removesuffix(".weight") + SCALE_SUFFIX
    if len(load.info.shape) != 2 or not load.info.name.endswith(".weight"):
      raise ValueError(
        f"{load.header.path}: tensor {load.info.name!r} is {weight_dtype}{list(load.info.shape)}, "
        "expected a Linear weight [out, in] (block-wise fp8)"
      )
    header, info = index.find(name)
    want = fmt.scale_shape(load.info.shape)
    if info.shape != want or info.dtype not in SCALE_DTYPES:
      raise ValueError(
        f"{header.path}: tensor {name!r} is {info.dtype}{list(info.shape)}, expected float32"
        f"{list(want)} (one scale per {fmt.rows}x{fmt.cols} block of {list(load.info.shape)})"
      )
    scales[part_key(load)] = StoredScale(TensorLoad(load.path, header, info, False), fmt.block)
  return scales


def plan_channel_scales(
  index, loads: Sequence[TensorLoad], stored: StoredQuantization
) -> dict[PartKey, StoredScale]:
  """The weight_scale of every tensor of a compressed-tensors checkpoint stored in the scheme's
  8-bit type that the model keeps in floats (a MoE's experts and quantized routers; the
  attention and dense MLP projections load as stored: models/quantized_loading.py), checked."""
  weight_dtype = np.dtype(jax.numpy.dtype(stored.scheme.weight_dtype))
  scales = {}
  for load in loads:
    if load.info.dtype != weight_dtype or is_quantized_kernel(load.path):
      continue
    name = load.info.name.removesuffix(".weight") + CT_SCALE_SUFFIX
    header, info = index.find(name)
    out, inner = load.info.shape
    channel = stored.strategy == "channel"
    shapes = ((out, 1), (out,)) if channel else ((), (1,))
    if info.shape not in shapes or info.dtype not in SCALE_DTYPES + (np.dtype(np.float16),):
      raise ValueError(
        f"{header.path}: tensor {name!r} is {info.dtype}{list(info.shape)}, expected a float "
        f"of shape {' or '.join(str(list(s)) for s in shapes)} ({stored.strategy} strategy)"
      )
    block = (1, inner) if channel else (out, inner)
    scales[part_key(load)] = StoredScale(TensorLoad(load.path, header, info, False), block)
  return scales


def dequantized_leaves(
  leaves: Sequence[LeafLoad], scales: dict[PartKey, StoredScale], dtype: np.dtype
) -> list[LeafLoad]:
  """The leaves with every stored weight part dequantized before the leaf's conversion (a leaf
  without a custom one gets the default transpose / concatenate / cast to `dtype`)."""
  out = []
  for leaf in leaves:
    found = [scales.get(part_key(part)) for part in leaf.parts]
    if not any(found):
      out.append(leaf)
      continue
    parts, blocks = [], []
    for part, scale in zip(leaf.parts, found, strict=True):
      parts.append(part)
      if scale is not None:
        parts.append(scale.load)
      blocks.append(None if scale is None else scale.block)
    inner = leaf.convert or float_converter(leaf.transpose, len(leaf.parts), np.dtype(dtype))
    outputs = leaf.outputs or (LeafOut(leaf.path, leaf.shape, np.dtype(dtype)),)
    out.append(LeafLoad(leaf.path, tuple(parts), _dequantizing(inner, tuple(blocks)), outputs))
  return out


@functools.cache
def _dequantizing(
  inner: Callable[..., jax.Array], blocks: tuple[tuple[int, int] | None, ...]
) -> Callable[..., jax.Array]:
  """raws (each stored part followed by its scale) -> inner(float32 parts)."""

  def convert(*raws: jax.Array):
    raws, parts = list(raws), []
    for block in blocks:
      weight = raws.pop(0)
      parts.append(weight if block is None else dequantize(weight, raws.pop(0), block))
    return inner(*parts)

  return convert
