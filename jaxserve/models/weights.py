"""Hugging Face safetensors checkpoints -> the flax `params` tree of the config's decoder
(models/causal_lm.py).

`hf_tensor_specs(config)` is the single table of the conversion, the config's family's
(models/families/, built from models/hf_tensors.py): for every flax leaf, the HF tensor name, its
HF shape and whether it is a transposed Linear weight (models/tensor_spec.py); a mixture of
experts' stacked leaf [E, in, out] has one entry per expert (models/expert_weights.py).
`param_shapes(config)` derives the abstract tree from it (used to restore orbax checkpoints and by
tests against `model.init`).

Loading first checks every tensor's presence and shape from the files' headers
(`plan_hf_tensors`), then moves the tensors to the device(s) as they are on disk, zero-copy views
of the mmapped files, and transposes / casts them there (weight_transfer: overlapped, each device
receiving only its shard when a `sharding` is given), and logs the GB and GB/s. A caller's `put`
gets host-converted arrays instead, one at a time. Single-file (`model.safetensors`) and sharded
(`model.safetensors.index.json`) layouts are read.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.models.dequantized_loading import (
  PartKey,
  StoredScale,
  dequantized_leaves,
  plan_block_scales,
  plan_channel_scales,
)
from jaxserve.models.expert_weights import (
  check_per_expert_layout,
  fp8_scale_path,
  fp8_stacked_leaves,
  stacked_leaves,
)
from jaxserve.models.families import family_of
from jaxserve.models.fp8_experts import scale_shape
from jaxserve.models.fused_projections import merged_leaves
from jaxserve.models.hf_config import model_config_from_hf
from jaxserve.models.leaf_load import LeafLoad, ParamPath, ShardingFn, TensorLoad
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.moe_config import keeps_block_fp8_experts
from jaxserve.models.quantized_dense import is_quantized_kernel, kernel_shape, scale_path
from jaxserve.models.quantized_loading import (
  plan_stored_scales,
  quantized_leaves,
  read_block_fp8,
  read_stored_quantization,
)
from jaxserve.models.safetensors_reader import (
  MappedFile,
  SafetensorsHeader,
  TensorInfo,
  read_header,
)
from jaxserve.models.tensor_spec import TensorSpec
from jaxserve.models.weight_transfer import TransferOptions, TransferStats, transfer_tensors
from jaxserve.quantization.block_fp8 import block_fp8
from jaxserve.quantization.compressed_tensors import stored_quantization
from jaxserve.quantization.scheme import scheme_for

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"

logger = logging.getLogger(__name__)

PutFn = Callable[[ParamPath, np.ndarray], jax.Array]


def hf_tensor_specs(config: ModelConfig) -> list[TensorSpec]:
  """Every params leaf of `config`'s model with its HF counterpart: its family's table
  (models/families/)."""
  return family_of(config).tensor_specs(config)


def _stacked_paths(config: ModelConfig) -> set[ParamPath]:
  return {spec.path for spec in hf_tensor_specs(config) if spec.expert is not None}


def _set_leaf(tree: dict, path: ParamPath, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def param_shapes(config: ModelConfig) -> dict:
  """The abstract params tree: a jax.ShapeDtypeStruct per leaf, in config.dtype; with
  config.quantization each projection kernel [out, in] in its 8-bit type beside a float32 scale
  [out] (models/quantized_dense.py); experts stacked [E, in, out]."""
  scheme = scheme_for(config.quantization)
  tree: dict = {}
  for spec in hf_tensor_specs(config):
    if scheme is not None and is_quantized_kernel(spec.path):
      in_features, out_features = spec.shape
      shape = kernel_shape(in_features, out_features)
      _set_leaf(tree, spec.path, jax.ShapeDtypeStruct(shape, jnp.dtype(scheme.weight_dtype)))
      _set_leaf(tree, scale_path(spec.path), jax.ShapeDtypeStruct((out_features,), jnp.float32))
    elif spec.expert is not None and config.expert_quantization != "none":
      out, inner = spec.hf_shape  # fp8 experts: [E, out, in] and their scales (fp8_experts.py)
      weight = jax.ShapeDtypeStruct((config.num_experts, out, inner), jnp.float8_e4m3fn)
      _set_leaf(tree, spec.path, weight)
      blocks = config.expert_quantization == "fp8_block"
      shape = scale_shape(config.num_experts, out, inner, blocks)
      _set_leaf(tree, fp8_scale_path(spec.path), jax.ShapeDtypeStruct(shape, jnp.float32))
    elif spec.expert is not None:
      shape = (config.num_experts,) + spec.shape
      _set_leaf(tree, spec.path, jax.ShapeDtypeStruct(shape, jnp.dtype(config.dtype)))
    else:
      _set_leaf(tree, spec.path, jax.ShapeDtypeStruct(spec.shape, jnp.dtype(config.dtype)))
  return tree


def load_hf_config(checkpoint_dir: Path, dtype: str = "auto") -> ModelConfig:
  """Reads `<checkpoint_dir>/config.json` into a ModelConfig; a compressed-tensors checkpoint's
  scheme becomes its `quantization` (an unsupported one is a ValueError naming it)."""
  path = Path(checkpoint_dir) / CONFIG_FILE
  if not path.is_file():
    raise ValueError(f"{path}: checkpoint config file not found")
  try:
    data = json.loads(path.read_text())
  except json.JSONDecodeError as err:
    raise ValueError(f"{path}: invalid JSON: {err}") from err
  try:
    stored = stored_quantization(data)
    fmt = block_fp8(data)  # its Linears load as floats (models/dequantized_loading.py) ...
    config = model_config_from_hf(data, dtype)
  except ValueError as err:
    raise ValueError(f"{path}: {err}") from err
  if fmt is not None and keeps_block_fp8_experts(config, fmt.block):
    config = config.replace(block_fp8_experts=True)  # ... but its experts stay fp8
  return config if stored is None else config.replace(quantization=stored.scheme.name)


def _tensor_files(checkpoint_dir: Path) -> tuple[dict[str, Path], Path]:
  """Maps every tensor name to its file; also returns the file that lists them (for errors)."""
  index = checkpoint_dir / INDEX_FILE
  single = checkpoint_dir / SINGLE_FILE
  if index.is_file():
    weight_map = json.loads(index.read_text()).get("weight_map")
    if not isinstance(weight_map, dict):
      raise ValueError(f"{index}: missing 'weight_map'")
    return {name: checkpoint_dir / file for name, file in weight_map.items()}, index
  if single.is_file():
    return {name: single for name in read_header(single).tensors}, single
  raise ValueError(f"{checkpoint_dir}: no {SINGLE_FILE} or {INDEX_FILE} found")


class TensorIndex:
  """A checkpoint's tensors by name, read from its files' headers alone (no weight is read)."""

  def __init__(self, checkpoint_dir: Path):
    self.files, self.listing = _tensor_files(Path(checkpoint_dir))
    self.headers: dict[Path, SafetensorsHeader] = {}

  def find(self, name: str) -> tuple[SafetensorsHeader, TensorInfo]:
    """The header and entry of tensor `name`; ValueError naming it when it is missing."""
    file = self.files.get(name)
    if file is None:
      raise ValueError(f"{self.listing}: missing tensor {name!r}")
    if file not in self.headers:
      if not file.is_file():
        raise ValueError(f"{file}: file not found (listed for tensor {name!r} in {self.listing})")
      self.headers[file] = read_header(file)
    info = self.headers[file].tensors.get(name)
    if info is None:
      raise ValueError(f"{file}: missing tensor {name!r}")
    return self.headers[file], info


def plan_hf_tensors(checkpoint_dir: Path, config: ModelConfig) -> list[TensorLoad]:
  """Every params leaf with its file and tensor, checked (presence, shape) from the files'
  headers alone, before any weight is read; a compressed-tensors checkpoint's scales too
  (models/quantized_loading.py)."""
  index = TensorIndex(checkpoint_dir)
  specs = hf_tensor_specs(config)
  if config.num_experts:
    check_per_expert_layout(index.files, index.listing)
  loads = []
  for spec in specs:
    header, info = index.find(spec.hf_name)
    if info.shape != spec.hf_shape:
      raise ValueError(
        f"{header.path}: tensor {spec.hf_name!r} has shape {info.shape}, expected {spec.hf_shape}"
      )
    loads.append(TensorLoad(spec.path, header, info, spec.transpose))
  stored = read_stored_quantization(checkpoint_dir)
  if stored is not None:
    loads += plan_stored_scales(index, specs, loads, stored)
  return loads


def plan_dequantized(checkpoint_dir: Path, loads: list[TensorLoad]) -> dict[PartKey, StoredScale]:
  """The scales of the planned tensors stored quantized that load as floats: every e4m3 weight
  of a block-wise fp8 checkpoint, the 8-bit experts and routers of a compressed-tensors one
  (models/dequantized_loading.py)."""
  fmt, stored = read_block_fp8(checkpoint_dir), read_stored_quantization(checkpoint_dir)
  if fmt is not None:
    return plan_block_scales(TensorIndex(checkpoint_dir), loads, fmt)
  if stored is not None:
    return plan_channel_scales(TensorIndex(checkpoint_dir), loads, stored)
  return {}


def load_hf_params(
  checkpoint_dir: Path,
  config: ModelConfig,
  *,
  put: PutFn | None = None,
  sharding: ShardingFn | None = None,
  options: TransferOptions = TransferOptions(),
) -> dict:
  """Loads and converts a HF safetensors checkpoint into the flax params tree (config.dtype).

  By default every tensor is moved raw and converted on the device, each leaf placed with
  `sharding(path, shape)` when given (weight_transfer). `put` instead receives each leaf converted
  on the host (the slower path, for callers that place arrays themselves)."""
  if put is not None:
    if config.quantization != "none" or read_block_fp8(checkpoint_dir) is not None:
      raise ValueError("quantization: a quantized model loads on the device path (no `put`)")
    leaves, stats = _put_host_converted(
      plan_hf_tensors(checkpoint_dir, config),
      np.dtype(jnp.dtype(config.dtype)),
      put,
      _stacked_paths(config),
    )
    _log(stats, checkpoint_dir)
    return _tree(leaves)
  return load_hf_weights(checkpoint_dir, config, sharding=sharding, options=options)[0]


def load_hf_weights(
  checkpoint_dir: Path,
  config: ModelConfig,
  *,
  fuse: bool = False,
  sharding: ShardingFn | None = None,
  options: TransferOptions = TransferOptions(),
) -> tuple[dict, TransferStats]:
  """load_hf_params on the device path, with its TransferStats (whether the layout was packed);
  `fuse` merges q/k/v and gate/up while converting (models/fused_projections); with
  config.quantization each projection is quantized as it loads, or loaded as stored from a
  compressed-tensors checkpoint (models/quantized_loading.py)."""
  loads = plan_hf_tensors(checkpoint_dir, config)
  dequantized = plan_dequantized(checkpoint_dir, loads)
  experts = config.expert_quantization
  if config.num_experts and config.quantization != "none" and experts == "none":
    logger.warning(
      "quantization %s: the attention projections only; the experts and routers stay in %s "
      "(models/moe_config.py)",
      config.quantization,
      config.dtype,
    )
  stacked = _stacked_paths(config)
  expert_loads = [load for load in loads if load.path in stacked]
  loads = [load for load in loads if load.path not in stacked]
  by_path = {load.path: load for load in loads}
  if fuse:
    leaves = [
      LeafLoad(path, tuple(by_path[part] for part in parts))
      for path, parts in merged_leaves(by_path)
    ]
  else:
    leaves = [LeafLoad(load.path, (load,)) for load in loads]
  leaves = quantized_leaves(leaves, config, read_stored_quantization(checkpoint_dir))
  dtype = np.dtype(jnp.dtype(config.dtype))
  if experts == "none":
    leaves += stacked_leaves(expert_loads, dtype)
  leaves = dequantized_leaves(leaves, dequantized, dtype)
  if experts != "none":  # fp8 experts: stored (with their scales) or quantized as they load
    leaves += fp8_stacked_leaves(expert_loads, dequantized, experts == "fp8_block")
  arrays, stats = transfer_tensors(leaves, dtype, sharding, options)
  _log(stats, checkpoint_dir)
  return _tree(arrays), stats


def _log(stats: TransferStats, checkpoint_dir: Path) -> None:
  logger.info("weights: %s from %s", stats.describe(), checkpoint_dir)


def _tree(leaves: dict[ParamPath, jax.Array]) -> dict:
  params: dict = {}
  for path, leaf in leaves.items():
    _set_leaf(params, path, leaf)
  return params


def _put_host_converted(
  loads: list[TensorLoad], dtype: np.dtype, put: PutFn, stacked: set[ParamPath]
) -> tuple[dict[ParamPath, jax.Array], TransferStats]:
  """One leaf at a time: its tensor(s) copied out of the file, transposed and cast on the host
  (a `stacked` leaf's experts stacked), then handed to `put` (which owns the copy)."""
  start = time.perf_counter()
  groups: dict[ParamPath, list[TensorLoad]] = {}
  for load in loads:
    groups.setdefault(load.path, []).append(load)
  leaves, files = {}, {}
  for leaf_path, parts in groups.items():
    arrays = []
    for load in parts:
      path = load.header.path
      if path not in files:
        files[path] = MappedFile.open(load.header, populate=False)
      array = files[path].view(load.info)  # [*hf_shape]
      arrays.append(np.array(array.T if load.transpose else array, dtype=dtype, order="C"))
    leaves[leaf_path] = put(leaf_path, np.stack(arrays) if leaf_path in stacked else arrays[0])
  return leaves, TransferStats(sum(load.info.nbytes for load in loads), time.perf_counter() - start)
