"""Hugging Face safetensors checkpoints -> the flax `params` tree of `LlamaForCausalLM`.

`hf_tensor_specs(config)` is the single table of the conversion: for every flax leaf, the HF tensor
name, its HF shape and whether it is a transposed Linear weight. `param_shapes(config)` derives the
abstract tree from it (used to restore orbax checkpoints and by tests against `model.init`).

Loading reads tensor by tensor through safetensors' numpy framework (memory-mapped files), converts
and casts one tensor, hands it to `put` (default `jax.device_put`; a sharded loader passes its own)
and drops the host copy, so at most one converted tensor is alive on the host at a time.
Single-file (`model.safetensors`) and sharded (`model.safetensors.index.json`) layouts are read.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, which safetensors' numpy reader needs)
import numpy as np
from safetensors import safe_open

from jaxserve.models.model_config import ModelConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"

ParamPath = tuple[str, ...]
PutFn = Callable[[ParamPath, np.ndarray], jax.Array]


@dataclass(frozen=True)
class TensorSpec:
  """One params leaf: where it lives in the flax tree and in the HF checkpoint."""
  path: ParamPath
  hf_name: str
  hf_shape: tuple[int, ...]
  transpose: bool  # HF Linear weight [out, in] -> flax kernel [in, out]

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(reversed(self.hf_shape)) if self.transpose else self.hf_shape


def hf_tensor_specs(config: ModelConfig) -> list[TensorSpec]:
  """Every params leaf of `config`'s model with its HF counterpart."""
  c = config
  q_dim, kv_dim = c.num_q_heads * c.head_dim, c.num_kv_heads * c.head_dim
  specs = [TensorSpec(("embed_tokens", "embedding"), "model.embed_tokens.weight",
                      (c.vocab_size, c.hidden_size), False)]
  for i in range(c.num_layers):
    hf, fx = f"model.layers.{i}", f"layers_{i}"
    linear = lambda module, name, out_dim, in_dim: TensorSpec(
        (fx, module, name, "kernel"), f"{hf}.{module}.{name}.weight", (out_dim, in_dim), True)
    vector = lambda path, hf_name, dim: TensorSpec(path, hf_name, (dim,), False)
    specs += [
        vector((fx, "input_layernorm", "scale"), f"{hf}.input_layernorm.weight", c.hidden_size),
        linear("self_attn", "q_proj", q_dim, c.hidden_size),
        linear("self_attn", "k_proj", kv_dim, c.hidden_size),
        linear("self_attn", "v_proj", kv_dim, c.hidden_size),
        linear("self_attn", "o_proj", c.hidden_size, q_dim),
    ]
    if c.attention_bias:
      specs += [vector((fx, "self_attn", name, "bias"), f"{hf}.self_attn.{name}.bias", dim)
                for name, dim in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim))]
    if c.qk_norm:
      specs += [vector((fx, "self_attn", name, "scale"), f"{hf}.self_attn.{name}.weight", c.head_dim)
                for name in ("q_norm", "k_norm")]
    specs += [
        vector((fx, "post_attention_layernorm", "scale"), f"{hf}.post_attention_layernorm.weight",
               c.hidden_size),
        linear("mlp", "gate_proj", c.intermediate_size, c.hidden_size),
        linear("mlp", "up_proj", c.intermediate_size, c.hidden_size),
        linear("mlp", "down_proj", c.hidden_size, c.intermediate_size),
    ]
  specs.append(TensorSpec(("norm", "scale"), "model.norm.weight", (c.hidden_size,), False))
  if not c.tie_word_embeddings:
    specs.append(TensorSpec(("lm_head", "kernel"), "lm_head.weight",
                            (c.vocab_size, c.hidden_size), True))
  return specs


def _set_leaf(tree: dict, path: ParamPath, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def param_shapes(config: ModelConfig) -> dict:
  """The abstract params tree: a jax.ShapeDtypeStruct per leaf, in config.dtype."""
  tree: dict = {}
  for spec in hf_tensor_specs(config):
    _set_leaf(tree, spec.path, jax.ShapeDtypeStruct(spec.shape, jnp.dtype(config.dtype)))
  return tree


def load_hf_config(checkpoint_dir: Path, dtype: str = "auto") -> ModelConfig:
  """Reads `<checkpoint_dir>/config.json` into a ModelConfig."""
  path = Path(checkpoint_dir) / CONFIG_FILE
  if not path.is_file():
    raise ValueError(f"{path}: checkpoint config file not found")
  try:
    data = json.loads(path.read_text())
  except json.JSONDecodeError as err:
    raise ValueError(f"{path}: invalid JSON: {err}") from err
  try:
    return ModelConfig.from_hf_config(data, dtype)
  except ValueError as err:
    raise ValueError(f"{path}: {err}") from err


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
    with safe_open(single, framework="np") as f:
      return {name: single for name in f.keys()}, single
  raise ValueError(f"{checkpoint_dir}: no {SINGLE_FILE} or {INDEX_FILE} found")


def load_hf_params(checkpoint_dir: Path, config: ModelConfig, *, put: PutFn | None = None) -> dict:
  """Loads and converts a HF safetensors checkpoint into the flax params tree (config.dtype)."""
  checkpoint_dir = Path(checkpoint_dir)
  put = put or (lambda path, array: jax.device_put(array))
  tensor_files, listing = _tensor_files(checkpoint_dir)
  dtype = np.dtype(jnp.dtype(config.dtype))
  params: dict = {}
  with contextlib.ExitStack() as stack:
    handles = {}
    for spec in hf_tensor_specs(config):
      file = tensor_files.get(spec.hf_name)
      if file is None:
        raise ValueError(f"{listing}: missing tensor {spec.hf_name!r}")
      if file not in handles:
        if not file.is_file():
          raise ValueError(f"{file}: file not found (listed for tensor {spec.hf_name!r} in {listing})")
        handle = stack.enter_context(safe_open(file, framework="np"))
        handles[file] = (handle, set(handle.keys()))
      handle, names = handles[file]
      if spec.hf_name not in names:
        raise ValueError(f"{file}: missing tensor {spec.hf_name!r}")
      _set_leaf(params, spec.path, put(spec.path, _read_tensor(handle, file, spec, dtype)))
  return params


def _read_tensor(handle, file: Path, spec: TensorSpec, dtype: np.dtype) -> np.ndarray:
  shape = tuple(handle.get_slice(spec.hf_name).get_shape())
  if shape != spec.hf_shape:
    raise ValueError(f"{file}: tensor {spec.hf_name!r} has shape {shape}, expected {spec.hf_shape}")
  array = handle.get_tensor(spec.hf_name)
  if spec.transpose:
    array = array.T
  return np.ascontiguousarray(array, dtype=dtype)
