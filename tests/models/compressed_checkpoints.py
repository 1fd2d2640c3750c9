"""Compressed-tensors checkpoints as llm-compressor writes them, made from a tiny float
checkpoint of tests/models/hf_checkpoints.py with the numpy reference quantizer
(jaxserve/quantization/reference.py): each q/k/v/o and MLP `weight` [out, in] in e4m3 or int8,
its `weight_scale` float32 [out, 1] ("channel") or [1] ("tensor"), an `input_scale` [1] per
projection for static activations, and config.json's `quantization_config`; lm_head, the
embedding and the norms as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from jaxserve.quantization import reference
from jaxserve.quantization.scheme import scheme_for

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _args(kind: str, strategy: str, dynamic: bool) -> dict:
  return {
    "num_bits": 8,
    "type": kind,
    "strategy": strategy,
    "symmetric": True,
    "dynamic": dynamic,
    "group_size": None,
    "block_structure": None,
    "actorder": None,
    "observer": None if dynamic else "minmax",
    "observer_kwargs": {},
  }


def quantization_config(scheme_name: str, strategy: str = "channel", static: bool = False):
  """config.json's quantization_config for one of our schemes, as llm-compressor writes it."""
  scheme = scheme_for(scheme_name)
  kind = "float" if scheme.is_float else "int"
  inputs = None
  if scheme.quantize_activations:
    inputs = _args(kind, "tensor" if static else "token", not static)
  return {
    "quant_method": "compressed-tensors",
    "format": "float-quantized" if scheme.is_float else "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
      "group_0": {
        "targets": ["Linear"],
        "weights": _args(kind, strategy, False),
        "input_activations": inputs,
        "output_activations": None,
      }
    },
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
  }


def _torch(array: np.ndarray) -> torch.Tensor:
  if array.dtype == reference.NUMPY_DTYPES["float8_e4m3fn"]:
    return torch.from_numpy(array.view(np.uint8).copy()).view(torch.float8_e4m3fn)
  return torch.from_numpy(np.ascontiguousarray(array))


def write_compressed_tensors(
  source: Path, out_dir: Path, scheme_name: str, strategy: str = "channel", static: bool = False
) -> Path:
  """A copy of the single-file checkpoint `source` with its projections quantized."""
  scheme = scheme_for(scheme_name)
  out_dir = Path(out_dir)
  shutil.copytree(source, out_dir)
  tensors = safetensors.torch.load_file(source / "model.safetensors")
  out = {}
  for name, tensor in tensors.items():
    module = name.removesuffix(".weight")
    if not (name.endswith(".weight") and module.split(".")[-1] in PROJECTIONS):
      out[name] = tensor
      continue
    w = tensor.float().numpy()  # [out, in]
    if strategy == "channel":
      q, scale = reference.quantize_weight(w, scheme)  # per output channel (row)
      scale = scale[:, None]  # [out, 1]
    else:
      q, scale = reference.quantize_weight(w.reshape(1, -1), scheme)  # one scale
      q = q.reshape(w.shape)
    out[name] = _torch(q)
    out[module + ".weight_scale"] = torch.from_numpy(np.asarray(scale, np.float32).reshape(-1, 1))
    if strategy == "tensor":
      out[module + ".weight_scale"] = out[module + ".weight_scale"].reshape(1)
    if static:
      out[module + ".input_scale"] = torch.tensor([0.05], dtype=torch.float32)
  safetensors.torch.save_file(out, out_dir / "model.safetensors", metadata={"format": "pt"})
  config = json.loads((source / "config.json").read_text())
  config["quantization_config"] = quantization_config(scheme_name, strategy, static)
  (out_dir / "config.json").write_text(json.dumps(config, indent=2))
  return out_dir


def write_dequantized(stored: Path, out_dir: Path) -> Path:
  """The float32 checkpoint a compressed-tensors one means (weight * weight_scale), for
  transformers to run as the reference."""
  out_dir = Path(out_dir)
  shutil.copytree(stored, out_dir)
  tensors = safetensors.torch.load_file(stored / "model.safetensors")
  out = {}
  for name, tensor in tensors.items():
    if name.endswith((".weight_scale", ".input_scale")):
      continue
    scale = tensors.get(name.removesuffix(".weight") + ".weight_scale")
    out[name] = tensor if scale is None else tensor.float() * scale.float().reshape(-1, 1)
  safetensors.torch.save_file(out, out_dir / "model.safetensors", metadata={"format": "pt"})
  config = json.loads((out_dir / "config.json").read_text())
  del config["quantization_config"]
  (out_dir / "config.json").write_text(json.dumps(config, indent=2))
  return out_dir
