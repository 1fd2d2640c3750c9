"""Mixtral (`MixtralForCausalLM`): Mistral's attention (every layer over `sliding_window` when
config.json sets one) and every layer's MLP the routed experts of models/layers/moe.py.

Config: the shared fields, the expert count (`num_experts` or `num_local_experts`),
`num_experts_per_tok`; each expert's intermediate size is config.json's `intermediate_size`; the
top-k routing weights are always renormalized (Mixtral's softmax over the top-k logits is the
same thing), so `norm_topk_prob` is True. Weights: the experts under `block_sparse_moe`, named
w1 / w3 / w2 for gate / up / down (`NAMES`, models/expert_weights.py). Every layer is sparse
(`dense_mlp_layers` empty). Random checkpoints are written for it, `intermediate_size` being the
experts' (a config whose two sizes differ is refused by the writer).
"""

from __future__ import annotations

from collections.abc import Mapping

from flax import linen as nn

from jaxserve.config.require import require as _require
from jaxserve.models.expert_weights import ExpertNames, expert_specs
from jaxserve.models.families.family import ModelFamily
from jaxserve.models.hf_fields import check_silu_mlp, common_fields, hf_field
from jaxserve.models.hf_tensors import decoder_specs
from jaxserve.models.layers.decoder import CausalLM, DecoderBlocks, DecoderLayer, sparse_moe_mlp
from jaxserve.models.layers.norms import RMSNorm
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.moe_config import hf_expert_count, require_every_layer_sparse
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


def config_json(c: ModelConfig) -> dict[str, object]:
  """The config.json fields beyond the shared ones (models/hf_config_json.py), as
  mistralai/Mixtral-8x7B-v0.1 writes them."""
  _require(
    c.intermediate_size == c.moe_intermediate_size,
    "moe_intermediate_size",
    f"Mixtral's config.json has one intermediate_size ({c.intermediate_size}) for its experts, "
    f"got {c.moe_intermediate_size}",
  )
  return {
    "hidden_act": "silu",
    "sliding_window": c.sliding_window,
    "num_local_experts": c.num_experts,
    "num_experts_per_tok": c.num_experts_per_tok,
    "router_aux_loss_coef": 0.02,
    "output_router_logits": False,
  }


FAMILY = ModelFamily(
  name="mixtral",
  architectures={"MixtralForCausalLM": "mixtral"},
  config_fields=config_fields,
  check=require_every_layer_sparse,
  tensor_specs=tensor_specs,
  decoder=MixtralForCausalLM,
  config_writers={"mixtral": config_json},
)
