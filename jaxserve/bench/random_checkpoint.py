"""Random-weight bfloat16 (or fp8) checkpoints with real model shapes, for throughput benchmarks.

`build_random_model(name, out_dir)` writes a named shape (models/named_shapes.py: Llama 3.x,
Qwen3-30B-A3B, Mixtral-8x7B, Gemma 3 12B / 27B) as config.json (models/hf_config_json.py), sharded
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

With `quantization="fp8"` (`--quantization fp8`) every projection the loader runs in fp8, the
experts' included, is quantized on that device right after it is drawn and written as fp8 with a
per-channel scale in the compressed-tensors layout (bench/fp8_random_weights.py), config.json
carrying its `quantization_config`: the same draws as the bfloat16 checkpoint of the same seed,
quantized, at half its bytes (Mixtral-8x7B: 47 GB instead of 93), never the whole float model on
the host. Shards are SHARD_BYTES of written bytes either way.

    python -m jaxserve.bench.random_checkpoint qwen3-30b-a3b /tmp/qwen3moe [--seed 0]
    python -m jaxserve.bench.random_checkpoint mixtral-8x7b /dev/shm/mixtral --quantization fp8

writes one from the command line (needs torch, the `bench` extra); without its arguments it is a
usage error, and --help lists the shapes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxserve.bench.fp8_random_weights import (
  QUANTIZATIONS,
  SCHEME,
  is_fp8_weight,
  quantization_config,
  quantize_fp8,
)
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


def build_random_model(
  name: str, out_dir: str | Path, seed: int = 0, quantization: str = "none"
) -> Path:
  """Writes a random-weight bfloat16 checkpoint of `name`'s shape into out_dir (its projections
  in fp8 with `quantization="fp8"`); returns it."""
  return build_random_checkpoint(named_model_config(name), out_dir, seed, quantization)


def build_random_checkpoint(
  config: ModelConfig, out_dir: str | Path, seed: int = 0, quantization: str = "none"
) -> Path:
  """Writes a random-weight checkpoint of `config` (its dtype; an architecture hf_config_json
  writes) into out_dir, its projections in fp8 with `quantization="fp8"`."""
  import torch
  from safetensors.torch import save_file

  if quantization not in QUANTIZATIONS:
    raise ValueError(f"quantization: must be one of {QUANTIZATIONS}, got {quantization!r}")
  hf_config = hf_config_json(config)  # refuses an architecture it cannot write, before any work
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  dtype = getattr(torch, config.dtype)
  norm_weight = IDENTITY_WEIGHT[family_of(config).decoder.blocks.norm]
  device = "cuda" if torch.cuda.is_available() else "cpu"
  generator = torch.Generator(device=device).manual_seed(seed)
  specs = hf_tensor_specs(config)
  fp8 = quantization == SCHEME.name
  if fp8:
    hf_config["quantization_config"] = quantization_config(specs)
  weight_map, shard, shard_bytes, shard_files, total = {}, {}, 0, [], 0

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
      tensors = {spec.hf_name: torch.full(spec.hf_shape, norm_weight, dtype=dtype)}
    else:
      tensor = torch.empty(spec.hf_shape, dtype=dtype, device=device)
      tensor.normal_(0.0, 0.02, generator=generator)
      quantized = fp8 and is_fp8_weight(spec)
      tensors = quantize_fp8(tensor, spec.hf_name) if quantized else {spec.hf_name: tensor}
    for hf_name, tensor in tensors.items():
      shard[hf_name] = tensor.cpu()
      shard_bytes += tensor.numel() * tensor.element_size()
      total += tensor.numel() * tensor.element_size()
    if shard_bytes >= SHARD_BYTES:
      flush()
  flush()
  if device == "cuda":
    torch.cuda.empty_cache()  # the engine that loads this checkpoint wants the GPU to itself
  (out_dir / "model.safetensors.index.json").write_text(
    json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
  )
  (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2))
  write_vocab_tokenizer(out_dir, config.vocab_size, config.bos_token_id, config.eos_token_ids)
  return out_dir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    prog="python -m jaxserve.bench.random_checkpoint",
    description="Writes a random-weight bfloat16 (or fp8) checkpoint of a named model shape.",
    formatter_class=DefaultsHelpFormatter,
  )
  parser.add_argument("shape", choices=sorted(SHAPES), help="the model shape")
  parser.add_argument("out_dir", help="the directory to write (created if missing)")
  parser.add_argument("--seed", type=int, default=0, help="the weights' random seed")
  parser.add_argument(
    "--quantization",
    choices=QUANTIZATIONS,
    default="none",
    help="fp8: the projections and experts stored as float8_e4m3fn with per-channel scales "
    "(compressed-tensors FP8-dynamic, loaded as the fp8 scheme); none: all in bfloat16",
  )
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  try:
    require("python -m jaxserve.bench.random_checkpoint", [Requirement("torch", "the weights")])
  except MissingDependencyError as err:
    print(err, file=sys.stderr)
    return 1
  out_dir = build_random_model(args.shape, args.out_dir, args.seed, args.quantization)
  print(f"wrote {out_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
