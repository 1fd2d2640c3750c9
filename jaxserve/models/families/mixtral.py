"""Mixtral (`MixtralForCausalLM`): Mistral's attention (every layer over `sliding_window` when
config.json sets one) and every layer's MLP the routed experts of models/layers/moe.py.

Config: the shared fields, the expert count (`num_experts` or `num_local_experts`),
`num_experts_per_tok`; each expert's intermediate size is config.json's `intermediate_size`; the
top-k routing weights are always renormalized (Mixtral's softmax over the top-k logits is the
same thing), so `norm_topk_prob` is True. Weights: the experts under `block_sparse_moe`, named
w1 / w3 / w2 for gate / up / down (`NAMES`, models/expert_weights.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from flax import linen as nn

from jaxserve.models.expert_weights import ExpertNames, expert_specs
from jaxserve.models.families.family import ModelFamily
from jaxserve.models.hf_fields import check_silu_mlp, common_fields, hf_field
from jaxserve.models.hf_tensors import decoder_specs
from jaxserve.models.layers.decoder import CausalLM, DecoderBlocks, DecoderLayer, sparse_moe_mlp
from jaxserve.models.layers.norms import RMSNorm
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.moe_config import hf_expert_count, require_experts
from jaxserve.models.tensor_spec import TensorSpec

NAMES = ExpertNames("block_sparse_moe", {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"})


class MixtralForCausalLM(CausalLM):
  """The pre-norm stack with RMSNorm and routed experts."""

  blocks = DecoderBlocks(norm=RMSNorm, activation=nn.silu, mlp=sparse_moe_mlp, layer=DecoderLayer)


def config_fields(d: Mapping, architecture: str) -> dict[str, object]:
  check_silu_mlp(d)
  return common_fields(d) | dict(
    sliding_window=d.get("sliding_window"),
    num_experts=hf_expert_count(d),
    num_experts_per_tok=hf_field(d, "num_experts_per_tok"),
    moe_intermediate_size=hf_field(d, "intermediate_size"),
    norm_topk_prob=True,
  )


def tensor_specs(config: ModelConfig) -> list[TensorSpec]:
  return decoder_specs(config, mlp=lambda c, i: expert_specs(c, i, NAMES))


FAMILY = ModelFamily(
  name="mixtral",
  architectures={"MixtralForCausalLM": "mixtral"},
  config_fields=config_fields,
  check=require_experts,
  tensor_specs=tensor_specs,
  decoder=MixtralForCausalLM,
)
