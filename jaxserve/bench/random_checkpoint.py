"""Random-weight bfloat16 Llama checkpoints with real model shapes, for throughput benchmarks.

`build_random_llama(name, out_dir)` writes config.json, sharded model*.safetensors with an index,
and a word-level tokenizer covering the whole vocabulary (vocab_tokenizer.py): every id a random
model samples decodes to a visible word, so a server streams, and `jaxserve bench serve` times,
every token as it would with a real model's tokenizer. No torch module is built: each tensor named
by `hf_tensor_specs` is drawn directly in bfloat16 on the fastest device (CUDA when available),
copied to the host and written shard by shard, so an 8B checkpoint takes seconds of compute and one
shard of host memory. Weights are N(0, 0.02) (transformers' initializer_range) with RMSNorm scales
of one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from jaxserve.bench.vocab_tokenizer import write_vocab_tokenizer
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.named_shapes import named_model_config
from jaxserve.models.weights import hf_tensor_specs
from jaxserve.tools.export_hf import hf_llama_config

SHARD_BYTES = 4 << 30


def random_llama_config(name: str) -> ModelConfig:
  """The named shape's config (models/named_shapes.py owns the shapes)."""
  return named_model_config(name)


def build_random_llama(name: str, out_dir: str | Path, seed: int = 0) -> Path:
  """Writes a random-weight bfloat16 checkpoint of `name`'s shape into out_dir; returns it."""
  return build_random_checkpoint(random_llama_config(name), out_dir, seed)


def build_random_checkpoint(config: ModelConfig, out_dir: str | Path, seed: int = 0) -> Path:
  """Writes a random-weight checkpoint of a llama `config` (its dtype) into out_dir."""
  import torch
  from safetensors.torch import save_file

  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  dtype = getattr(torch, config.dtype)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  generator = torch.Generator(device=device).manual_seed(seed)
  specs = hf_tensor_specs(config)
  weight_map, shard, shard_bytes, shard_files = {}, {}, 0, []
  tensor_bytes = torch.empty((), dtype=dtype).element_size()

  def flush() -> None:
    nonlocal shard, shard_bytes
    if shard:
      file = f"model-{len(shard_files) + 1:05d}.safetensors"
      save_file(shard, str(out_dir / file), metadata={"format": "pt"})
      shard_files.append(file)
      weight_map.update({tensor_name: file for tensor_name in shard})
      shard, shard_bytes = {}, 0

  for spec in specs:
    if spec.path[-1] == "scale":
      tensor = torch.ones(spec.hf_shape, dtype=dtype)
    else:
      tensor = torch.empty(spec.hf_shape, dtype=dtype, device=device)
      tensor.normal_(0.0, 0.02, generator=generator)
      tensor = tensor.cpu()
    shard[spec.hf_name] = tensor
    shard_bytes += tensor.numel() * tensor.element_size()
    if shard_bytes >= SHARD_BYTES:
      flush()
  flush()
  if device == "cuda":
    torch.cuda.empty_cache()  # the engine that loads this checkpoint wants the GPU to itself
  total = sum(tensor_bytes * math.prod(spec.hf_shape) for spec in specs)
  (out_dir / "model.safetensors.index.json").write_text(
    json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
  )
  hf_config = hf_llama_config(config, architectures=["LlamaForCausalLM"], dtype=config.dtype)
  hf_config.save_pretrained(out_dir)
  write_vocab_tokenizer(out_dir, config.vocab_size, config.bos_token_id, config.eos_token_ids)
  return out_dir
