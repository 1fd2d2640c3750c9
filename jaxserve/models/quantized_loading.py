"""A quantized model's projections from safetensors (models/weights.py calls this): quantized as
each loads from a float checkpoint, or taken as stored from a compressed-tensors one
(jaxserve/quantization/compressed_tensors.py: the format). Either way each projection becomes
its 8-bit `kernel` [out, in] and float32 `scale` [out] (models/quantized_dense.py), merged
projections concatenated along out, on the device, in one small jitted conversion per kind. HF
stores Linear weights [out, in] already, so a quantized kernel is never transposed (a float one
is, to flax's [in, out]).

A compressed-tensors checkpoint's scales are checked from the headers before any weight is read
(plan_stored_scales): each projection's `weight` must be in the scheme's type and its
`weight_scale` (and, for static activations, `input_scale`) present and shaped for the strategy;
otherwise a ValueError names the tensor. Tensor-strategy scales are broadcast to every channel.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.models.leaf_load import LeafLoad, LeafOut, TensorLoad
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.quantized_dense import is_quantized_kernel, kernel_shape, scale_path
from jaxserve.quantization.block_fp8 import BlockFp8, block_fp8
from jaxserve.quantization.compressed_tensors import (
  INPUT_SCALE_SUFFIX,
  SCALE_SUFFIX,
  StoredQuantization,
  stored_quantization,
)
from jaxserve.quantization.quantize import quantize_weight
from jaxserve.quantization.scheme import QuantScheme, scheme_for

SCALE_DTYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16))


def read_stored_quantization(checkpoint_dir: Path) -> StoredQuantization | None:
  """The compressed-tensors scheme of a checkpoint directory's config.json (None: float)."""
  path = Path(checkpoint_dir) / "config.json"
  if not path.is_file():
    return None
  try:
    return stored_quantization(json.loads(path.read_text()))
  except ValueError as err:
    raise ValueError(f"{path}: {err}") from err


def read_block_fp8(checkpoint_dir: Path) -> BlockFp8 | None:
  """The block of a block-wise fp8 checkpoint directory's config.json (None: not one)."""
  path = Path(checkpoint_dir) / "config.json"
  if not path.is_file():
    return None
  try:
    return block_fp8(json.loads(path.read_text()))
  except ValueError as err:
    raise ValueError(f"{path}: {err}") from err


def plan_stored_scales(
  index, specs: Sequence, loads: Sequence[TensorLoad], stored: StoredQuantization
) -> list[TensorLoad]:
  """The scale of every projection of a compressed-tensors checkpoint, as TensorLoads at the
  kernel's `scale` path, each checked (presence, shape, dtype) with its weight's type and, for
  static activations, its input_scale. `index`: weights.TensorIndex; `specs`: its TensorSpecs."""
  weight_dtype = np.dtype(jnp.dtype(stored.scheme.weight_dtype))
  by_path = {load.path: load for load in loads}
  scales = []
  for spec in specs:
    if not is_quantized_kernel(spec.path):
      continue
    weight = by_path[spec.path]
    if weight.info.dtype != weight_dtype:
      raise ValueError(
        f"{weight.header.path}: tensor {spec.hf_name!r} is {weight.info.dtype}, expected "
        f"{weight_dtype} ({stored.scheme.describe()}, compressed-tensors)"
      )
    module = spec.hf_name.removesuffix(".weight")
    name = module + SCALE_SUFFIX
    header, info = index.find(name)
    out = spec.hf_shape[0]
    shapes = ((out, 1), (out,)) if stored.strategy == "channel" else ((), (1,))
    if info.shape not in shapes or info.dtype not in SCALE_DTYPES:
      raise ValueError(
        f"{header.path}: tensor {name!r} is {info.dtype}{list(info.shape)}, expected a float "
        f"of shape {' or '.join(str(list(s)) for s in shapes)} ({stored.strategy} strategy)"
      )
    scales.append(TensorLoad(scale_path(spec.path), header, info, False))
    if stored.static_input_scale:
      input_name = module + INPUT_SCALE_SUFFIX
      header, info = index.find(input_name)
      if info.shape not in ((), (1,)):
        raise ValueError(
          f"{header.path}: tensor {input_name!r} has shape {list(info.shape)}, expected [] or [1]"
        )
  return scales


def quantized_leaves(
  leaves: Sequence[LeafLoad], config: ModelConfig, stored: StoredQuantization | None
) -> list[LeafLoad]:
  """The leaves with each projection's conversion replaced: quantized on load (float
  checkpoint) or taken as stored (scales broadcast per channel); the kernel's parts keep HF's
  [out, in] (no transpose) and are concatenated along out."""
  scheme = scheme_for(config.quantization)
  if stored is not None and stored.scheme != scheme:
    raise ValueError(
      f"quantization: the checkpoint stores {stored.scheme.name}, not {config.quantization}"
    )
  if scheme is None:
    return list(leaves)
  widths = {
    scale_path(leaf.path): tuple(part.info.shape[0] for part in leaf.parts)  # HF [out, in]
    for leaf in leaves
    if is_quantized_kernel(leaf.path)
  }
  weight_dtype = np.dtype(jnp.dtype(scheme.weight_dtype))
  out = []
  for leaf in leaves:
    if is_quantized_kernel(leaf.path):
      parts = tuple(dataclasses.replace(part, transpose=False) for part in leaf.parts)
      shape = LeafLoad(leaf.path, parts).shape  # [sum(out), in]
      kernel = LeafOut(leaf.path, kernel_shape(shape[1], shape[0]), weight_dtype)
      if stored is None:
        scale = LeafOut(scale_path(leaf.path), shape[:1], np.dtype(np.float32))
        out.append(LeafLoad(leaf.path, parts, _quantizer(scheme), (kernel, scale)))
      else:
        out.append(LeafLoad(leaf.path, parts, _stored_kernel, (kernel,)))
    elif leaf.path in widths:
      scale = LeafOut(leaf.path, (sum(widths[leaf.path]),), np.dtype(np.float32))
      out.append(LeafLoad(leaf.path, leaf.parts, _stored_scale(widths[leaf.path]), (scale,)))
    else:
      out.append(leaf)
  return out


def _kernel(raws: Sequence[jax.Array]) -> jax.Array:
  """HF [out, in] parts -> one [sum(out), in] kernel, as stored (no transpose); a new buffer
  even of one part (jit would hand an input returned as it is back, and the loader frees the
  raw tensors)."""
  return jnp.copy(raws[0]) if len(raws) == 1 else jnp.concatenate(raws, axis=0)


@functools.cache
def _quantizer(scheme: QuantScheme) -> Callable[..., tuple[jax.Array, jax.Array]]:
  """The float parts -> (8-bit kernel, float32 scale): quantize.quantize_weight of the merged
  kernel, from the checkpoint's own values (no rounding to the model dtype first)."""
  return lambda *raws: quantize_weight(_kernel(raws).astype(jnp.float32), scheme)


def _stored_kernel(*raws: jax.Array) -> jax.Array:
  return _kernel(raws)


@functools.cache
def _stored_scale(widths: tuple[int, ...]) -> Callable[..., jax.Array]:
  """Each part's weight_scale ([out, 1], [out], [1] or []) -> float32 [out], concatenated."""
  return lambda *raws: jnp.concatenate(
    [
      jnp.broadcast_to(raw.reshape(-1).astype(jnp.float32), (width,))
      for raw, width in zip(raws, widths, strict=True)
    ]
  )
