"""The mixture-of-experts fields of ModelConfig: what they must hold and how a Hugging Face
config.json sets them.

A MoE architecture (Qwen3-MoE, Mixtral) routes every layer's MLP to `num_experts_per_tok` of its
`num_experts` SwiGLU experts of `moe_intermediate_size` (models/moe.py); a dense architecture
keeps the three counts at 0. Qwen3-MoE's `mlp_only_layers` and `decoder_sparse_step` (dense MLP
layers among the sparse ones) are load errors unless they leave every layer sparse, as in every
published Qwen3-MoE checkpoint. Qwen3-MoE renormalizes its top-k routing weights when
`norm_topk_prob`; Mixtral always does (its softmax over the top-k logits is the same thing), so
its `norm_topk_prob` is True. The routers' auxiliary-loss fields (`router_aux_loss_coef`,
`output_router_logits`, `router_jitter_noise`) only matter in training and are ignored.

A MoE model refuses `batch_invariant` (the routing and the grouped matmul do not run through the
fixed-tile GEMMs, so a token's bits could depend on its batch) and `quantization` (the experts'
grouped matmuls, models/grouped_matmul.py, take no 8-bit weights): each is a ValueError naming it.
"""

from __future__ import annotations

from typing import Mapping, Protocol

from jaxserve.config_require import require as _require
from jaxserve.config_require import require_bool

MOE_ARCHITECTURES = ("qwen3_moe", "mixtral")
COUNTS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")


class ExpertFields(Protocol):
  """The ModelConfig fields the checks read."""

  architecture: str
  num_experts: int
  num_experts_per_tok: int
  moe_intermediate_size: int
  norm_topk_prob: bool
  batch_invariant: bool
  quantization: str


def _positive_int(value: object) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_experts(c: ExpertFields) -> None:
  """ValueError naming the first MoE field that does not fit `c.architecture`."""
  if c.architecture not in MOE_ARCHITECTURES:
    for name in COUNTS:
      value = getattr(c, name)
      _require(value == 0, name, f"must be 0 for {c.architecture}, got {value!r}")
    return
  for name in COUNTS:
    value = getattr(c, name)
    _require(
      _positive_int(value), name, f"must be a positive integer for {c.architecture}, got {value!r}"
    )
  _require(
    c.num_experts_per_tok <= c.num_experts,
    "num_experts_per_tok",
    f"must not exceed num_experts ({c.num_experts}), got {c.num_experts_per_tok}",
  )
  require_bool(c.norm_topk_prob, "norm_topk_prob")
  unsupported = "is not supported with mixture-of-experts layers (models/moe_config.py)"
  _require(not c.batch_invariant, "batch_invariant", unsupported)
  _require(c.quantization == "none", "quantization", f"{c.quantization} {unsupported}")


def _hf_count(d: Mapping, name: str) -> object:
  _require(d.get(name) is not None, name, "missing from the Hugging Face config")
  return d[name]


def hf_experts(d: Mapping, architecture: str) -> dict[str, object]:
  """The MoE fields of a Qwen3-MoE or Mixtral config.json; {} for a dense architecture. Hub
  checkpoints name the expert count `num_experts` (Qwen3-MoE) or `num_local_experts` (Mixtral,
  and what transformers 5 writes for both)."""
  if architecture not in MOE_ARCHITECTURES:
    return {}
  counts = {d[name] for name in ("num_experts", "num_local_experts") if d.get(name) is not None}
  _require(len(counts) == 1, "num_experts", f"expected one expert count, got {sorted(counts)}")
  fields = dict(num_experts=counts.pop(), num_experts_per_tok=_hf_count(d, "num_experts_per_tok"))
  if architecture == "mixtral":
    return fields | dict(
      moe_intermediate_size=_hf_count(d, "intermediate_size"), norm_topk_prob=True
    )
  mlp_only = d.get("mlp_only_layers") or []
  _require(not mlp_only, "mlp_only_layers", f"dense MLP layers are not supported, got {mlp_only}")
  step = d.get("decoder_sparse_step", 1)
  _require(step == 1, "decoder_sparse_step", f"must be 1 (every layer sparse), got {step!r}")
  return fields | dict(
    moe_intermediate_size=_hf_count(d, "moe_intermediate_size"),
    norm_topk_prob=bool(d.get("norm_topk_prob", False)),
  )
