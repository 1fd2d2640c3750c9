"""The weight bytes one decode token reads, whose read time is the floor of a single stream's
time per output token.

A dense model reads every weight once per step. A mixture of experts reads every weight outside
its experts (attention, norms, routers, the output projection) and, per layer, the
num_experts_per_tok experts its token is routed to: num_experts_per_tok / num_experts of the
stacked experts. The input embedding contributes one row (the lookup), unless it is tied to the
output projection, which reads all of it. Counted from the checkpoint's tensor table
(models/weights.hf_tensor_specs) in the model's dtype.

    python -m jaxserve.bench.active_weights /tmp/qwen3moe     # JSON: bytes, active bytes

prints both counts for a checkpoint directory (its config.json alone is read) or a named shape.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import jax.numpy as jnp

from jaxserve.models.model_config import ModelConfig
from jaxserve.models.named_shapes import SHAPES, named_model_config
from jaxserve.models.weights import hf_tensor_specs, load_hf_config

EMBEDDING = ("embed_tokens", "embedding")


def weight_bytes(config: ModelConfig) -> int:
  """Every weight of `config`, in its dtype."""
  itemsize = jnp.dtype(config.dtype).itemsize
  return itemsize * sum(math.prod(spec.hf_shape) for spec in hf_tensor_specs(config))


def active_weight_bytes(config: ModelConfig) -> int:
  """The bytes one decode token reads (module docstring); a stacked expert's share is its
  routing fraction, rounded down once over the whole model."""
  itemsize = jnp.dtype(config.dtype).itemsize
  dense, experts = 0, 0
  for spec in hf_tensor_specs(config):
    count = math.prod(spec.hf_shape)
    if spec.expert is not None:
      experts += count
    elif spec.path == EMBEDDING and not config.tie_word_embeddings:
      dense += config.hidden_size  # one row
    else:
      dense += count
  if experts:
    experts = experts * config.num_experts_per_tok // config.num_experts
  return itemsize * (dense + experts)


def _config(model: str) -> ModelConfig:
  return named_model_config(model) if model in SHAPES else load_hf_config(Path(model))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m jaxserve.bench.active_weights",
    description="Prints a model's weight bytes and the bytes one decode token reads.",
  )
  parser.add_argument("model", help=f"a checkpoint directory or a named shape ({sorted(SHAPES)})")
  args = parser.parse_args(argv)
  config = _config(args.model)
  result = {
    "model": args.model,
    "weight_bytes": weight_bytes(config),
    "active_weight_bytes": active_weight_bytes(config),
  }
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
