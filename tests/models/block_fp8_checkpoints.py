"""Block-wise fp8 checkpoints as DeepSeek-V3 and Qwen3-*-FP8 are published (transformers'
FineGrainedFP8Config format), made from a tiny float checkpoint of tests/models/hf_checkpoints.py
in torch, independently of jaxserve: every Linear `weight` [out, in] of the attention, MLP and
experts in e4m3 with `weight_scale_inv` float32 [ceil(out / 128), ceil(in / 128)], one per
128x128 block (partial where a dimension is not a multiple of 128), scale = the block's largest
magnitude / 448; lm_head, the embeddings, norms and MoE routers as they were
(`modules_to_not_convert`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import safetensors.torch
import torch

BLOCK = 128
FP8_MAX = 448.0
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANTIZED += ("w1", "w2", "w3")  # Mixtral's experts


def quantization_config(block: int = BLOCK) -> dict:
  return {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [block, block],
    "modules_to_not_convert": ["lm_head"],
  }


def quantize_blocks(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
  """w [out, in] -> (q e4m3 [out, in], scale_inv float32 [ceil(out/b), ceil(in/b)])."""
  out, inner = w.shape
  rows, cols = -(-out // block), -(-inner // block)
  padded = torch.zeros(rows * block, cols * block, dtype=torch.float32)
  padded[:out, :inner] = w.float()
  blocks = padded.reshape(rows, block, cols, block)
  amax = blocks.abs().amax(dim=(1, 3))
  scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
  q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
  return q.reshape(rows * block, cols * block)[:out, :inner].contiguous(), scale


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
  """What the format means: float(q) * the scale of its block, float32."""
  full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)
  return q.float() * full[: q.shape[0], : q.shape[1]]


def write_block_fp8(source: Path, out_dir: Path, block: int = BLOCK) -> Path:
  """A copy of the single-file checkpoint `source` with its Linears block-quantized."""
  out_dir = Path(out_dir)
  shutil.copytree(source, out_dir)
  out = {}
  for name, tensor in safetensors.torch.load_file(source / "model.safetensors").items():
    module = name.removesuffix(".weight")
    if name.endswith(".weight") and module.split(".")[-1] in QUANTIZED:
      out[name], out[module + ".weight_scale_inv"] = quantize_blocks(tensor, block)
    else:
      out[name] = tensor
  safetensors.torch.save_file(out, out_dir / "model.safetensors", metadata={"format": "pt"})
  config = json.loads((source / "config.json").read_text())
  config["quantization_config"] = quantization_config(block)
  (out_dir / "config.json").write_text(json.dumps(config, indent=2))
  return out_dir


def write_dequantized(block_fp8_dir: Path, out_dir: Path, block: int = BLOCK) -> Path:
  """The float32 checkpoint a block-wise fp8 one means (transformers' Fp8Dequantize:
  float(q) * scale_inv per block), for transformers to run as the reference."""
  out_dir = Path(out_dir)
  shutil.copytree(block_fp8_dir, out_dir)
  tensors = safetensors.torch.load_file(block_fp8_dir / "model.safetensors")
  out = {}
  for name, tensor in tensors.items():
    if name.endswith(".weight_scale_inv"):
      continue
    scale = tensors.get(name.removesuffix(".weight") + ".weight_scale_inv")
    out[name] = tensor if scale is None else dequantize_blocks(tensor, scale, block)
  safetensors.torch.save_file(out, out_dir / "model.safetensors", metadata={"format": "pt"})
  config = json.loads((out_dir / "config.json").read_text())
  del config["quantization_config"]
  (out_dir / "config.json").write_text(json.dumps(config, indent=2))
  return out_dir
