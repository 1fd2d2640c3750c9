"""Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3's attention (per-head q/k RMSNorm before RoPE) and
each layer's MLP the routed experts of models/layers/moe.py or, in the layers config.json makes
dense, the gated MLP of `intermediate_size`.

Config: the shared fields, Qwen's sliding-window rule (models/families/qwen.py), the expert
count (`num_experts` or `num_local_experts`), `num_experts_per_tok`, `moe_intermediate_size`,
`norm_topk_prob` (renormalize the top-k routing weights; default False). The dense layers
(`ModelConfig.dense_mlp_layers`) follow transformers' rule (modeling_qwen3_moe.py): layer i is
sparse when i is not in `mlp_only_layers` (default []) and (i + 1) % `decoder_sparse_step`
(default 1) == 0; every published Qwen3-MoE checkpoint leaves every layer sparse. An index of
`mlp_only_layers` outside the layers, or a step below 1, is a load error naming the field.
Weights: the experts under `mlp` with transformers' projection names (`NAMES`,
models/expert_weights.py); a dense layer's `mlp.{gate,up,down}_proj` as a dense model's.
Random checkpoints are written for it (the dense layers as `mlp_only_layers`).
"""

from __future__ import annotations

from collections.abc import Mapping

from flax import linen as nn

from jaxserve.config.require import require as _require
from jaxserve.models.expert_weights import PROJECTIONS, ExpertNames, expert_specs
from jaxserve.models.families.family import ModelFamily
from jaxserve.models.families.qwen import sliding_window_config
from jaxserve.models.hf_fields import check_silu_mlp, common_fields, hf_field
from jaxserve.models.hf_tensors import decoder_specs, dense_mlp_specs
from jaxserve.models.layers.decoder import CausalLM, DecoderBlocks, DecoderLayer, sparse_moe_mlp
from jaxserve.models.layers.norms import RMSNorm
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.moe_config import hf_expert_count, require_experts
from jaxserve.models.tensor_spec import TensorSpec

NAMES = ExpertNames("mlp", {name: name for name in PROJECTIONS})


class Qwen3MoeForCausalLM(CausalLM):
  """The pre-norm stack with RMSNorm and routed experts."""

  blocks = DecoderBlocks(norm=RMSNorm, activation=nn.silu, mlp=sparse_moe_mlp, layer=DecoderLayer)


def config_fields(d: Mapping, architecture: str) -> dict[str, object]:
  check_silu_mlp(d)
  fields = common_fields(d) | dict(sliding_window=sliding_window_config(d), qk_norm=True)
  num_experts, top_k = hf_expert_count(d), hf_field(d, "num_experts_per_tok")
  return fields | dict(
    num_experts=num_experts,
    num_experts_per_tok=top_k,
    moe_intermediate_size=hf_field(d, "moe_intermediate_size"),
    norm_topk_prob=bool(d.get("norm_topk_prob", False)),
    dense_mlp_layers=dense_layers(d, fields["num_layers"]),
  )


def dense_layers(d: Mapping, num_layers: int) -> tuple[int, ...]:
  """The layers transformers gives a dense MLP (module docstring)."""
  mlp_only = d.get("mlp_only_layers") or []
  _require(
    isinstance(mlp_only, list) and all(type(i) is int and 0 <= i < num_layers for i in mlp_only),
    "mlp_only_layers",
    f"must list layer indices in [0, {num_layers}), got {mlp_only!r}",
  )
  step = d.get("decoder_sparse_step")
  step = 1 if step is None else step
  _require(
    isinstance(step, int) and not isinstance(step, bool) and step >= 1,
    "decoder_sparse_step",
    f"must be a positive integer, got {step!r}",
  )
  return tuple(i for i in range(num_layers) if i in mlp_only or (i + 1) % step != 0)


def _mlp_specs(c: ModelConfig, layer: int) -> list[TensorSpec]:
  return expert_specs(c, layer, NAMES) if c.is_moe_layer(layer) else dense_mlp_specs(c, layer)


def tensor_specs(config: ModelConfig) -> list[TensorSpec]:
  return decoder_specs(config, mlp=_mlp_specs)


def config_json(c: ModelConfig) -> dict[str, object]:
  """The config.json fields beyond the shared ones (models/hf_config_json.py)."""
  return {
    "hidden_act": "silu",
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": c.num_layers,
    "decoder_sparse_step": 1,
    "mlp_only_layers": list(c.dense_mlp_layers),
    "num_experts": c.num_experts,
    "num_experts_per_tok": c.num_experts_per_tok,
    "moe_intermediate_size": c.moe_intermediate_size,
    "norm_topk_prob": c.norm_topk_prob,
  }


FAMILY = ModelFamily(
  name="qwen3_moe",
  architectures={"Qwen3MoeForCausalLM": "qwen3_moe"},
  config_fields=config_fields,
  check=require_experts,
  tensor_specs=tensor_specs,
  decoder=Qwen3MoeForCausalLM,
  config_writers={"qwen3_moe": config_json},
)
