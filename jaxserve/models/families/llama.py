"""The Llama family: Llama 2 / 3.x (`LlamaForCausalLM`) and Mistral (`MistralForCausalLM`).

Decoder: the shared pre-norm stack (models/layers/decoder.py) with RMSNorm (weight applied after
casting back to the input dtype), a SiLU-gated MLP, unscaled embeddings. Its `LLAMA_BLOCKS` and
`LlamaForCausalLM` are also Qwen's (models/families/qwen.py): the same block, other config
fields. Config: the shared fields (models/hf_fields.py; SiLU, no MLP biases); Mistral's every
layer attends over `sliding_window` when config.json sets one, Llama's over the whole context.
Weights: the shared names (models/hf_tensors.py). Random checkpoints are written for "llama".
"""

from __future__ import annotations

from collections.abc import Mapping

from flax import linen as nn

from jaxserve.models.families.family import ModelFamily
from jaxserve.models.hf_fields import check_silu_mlp, common_fields
from jaxserve.models.hf_tensors import decoder_specs
from jaxserve.models.layers.decoder import CausalLM, DecoderBlocks, DecoderLayer, dense_mlp
from jaxserve.models.layers.norms import RMSNorm
from jaxserve.models.moe_config import require_dense

LLAMA_BLOCKS = DecoderBlocks(norm=RMSNorm, activation=nn.silu, mlp=dense_mlp, layer=DecoderLayer)


class LlamaForCausalLM(CausalLM):
  """The Llama-family decoder (the shared stack with LLAMA_BLOCKS)."""

  blocks = LLAMA_BLOCKS


def config_fields(d: Mapping, architecture: str) -> dict[str, object]:
  check_silu_mlp(d)
  window = d.get("sliding_window") if architecture == "mistral" else None
  return common_fields(d) | dict(sliding_window=window)


FAMILY = ModelFamily(
  name="llama",
  architectures={"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral"},
  config_fields=config_fields,
  check=require_dense,
  tensor_specs=decoder_specs,
  decoder=LlamaForCausalLM,
  config_writers={"llama": lambda config: {}},
)
