"""Random-weight bfloat16 checkpoints with real model shapes, for throughput benchmarks.

`build_random_model(name, out_dir)` writes a named shape (models/named_shapes.py: Llama 3.x,
Qwen3-30B-A3B, Gemma 3 12B / 27B) as config.json (models/hf_config_json.py), sharded
model*.safetensors with an index, and a word-level tokenizer covering the whole vocabulary
(vocab_tokenizer.py): every id a random model samples decodes to a visible word, so a server
streams, and `jaxserve bench serve` times, every token as it would with a real model's tokenizer.
No torch module is built: each tensor named by `hf_tensor_specs` (a mixture of experts' one per
expert and projection, as published) is drawn directly in bfloat16 on the fastest device (CUDA
when available), copied to the host and written shard by shard, so a 30B checkpoint takes
seconds of compute and one shard (SHARD_BYTES) of host memory. Weights are N(0, 0.02)
(transformers' initializer_range); norm weights are the identity scale of the family's norm
(`IDENTITY_WEIGHT`, models/layers/norms.py): one, or zero for Gemma's, which multiplies by
(1 + weight).

    python -m jaxserve.bench.random_checkpoint qwen3-30b-a3b /tmp/qwen3moe [--seed 0]

writes one from the command line (needs torch, the `bench` extra); without its arguments it is a
usage error, and --help lists the shapes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from jaxserve.bench.vocab_tokenizer import write_vocab_tokenizer
from jaxserve.config.cli_help import DefaultsHelpFormatter
from jaxserve.models.families import family_of
from jaxserve.models.hf_config_json import hf_config_json
from jaxserve.models.layers.norms import IDENTITY_WEIGHT
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.named_shapes import SHAPES, named_model_config
from jaxserve.models.weights import hf_tensor_specs
from jaxserve.runtime.optional_deps import MissingDependencyError, Requirement, require

SHARD_BYTES = 4 << 30


def build_random_model(name: str, out_dir: str | Path, seed: int = 0) -> Path:
  """Writes a random-weight bfloat16 checkpoint of `name`'s shape into out_dir; returns it."""
  return build_random_checkpoint(named_model_config(name), out_dir, seed)


def build_random_checkpoint(config: ModelConfig, out_dir: str | Path, seed: int = 0) -> Path:
  """Writes a random-weight checkpoint of `config` (its dtype; an architecture hf_config_json
  writes) into out_dir."""
  import torch
  from safetensors.torch import save_file

  hf_config = hf_config_json(config)  # refuses an architecture it cannot write, before any work
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  dtype = getattr(torch, config.dtype)
  norm_weight = IDENTITY_WEIGHT[family_of(config).decoder.blocks.norm]
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
      tensor = torch.full(spec.hf_shape, norm_weight, dtype=dtype)
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
  (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2))
  write_vocab_tokenizer(out_dir, config.vocab_size, config.bos_token_id, config.eos_token_ids)
  return out_dir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    prog="python -m jaxserve.bench.random_checkpoint",
    description="Writes a random-weight bfloat16 checkpoint of a named model shape.",
    formatter_class=DefaultsHelpFormatter,
  )
  parser.add_argument("shape", choices=sorted(SHAPES), help="the model shape")
  parser.add_argument("out_dir", help="the directory to write (created if missing)")
  parser.add_argument("--seed", type=int, default=0, help="the weights' random seed")
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  try:
    require("python -m jaxserve.bench.random_checkpoint", [Requirement("torch", "the weights")])
  except MissingDependencyError as err:
    print(err, file=sys.stderr)
    return 1
  print(f"wrote {build_random_model(args.shape, args.out_dir, args.seed)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
