"""The mixture-of-experts fields of ModelConfig: what they must hold, and the config.json reader
both MoE families share.

A mixture of experts (`num_experts` > 0) routes each layer's MLP to `num_experts_per_tok` of
its `num_experts` SwiGLU experts of `moe_intermediate_size` (models/layers/moe.py), except the
layers listed in `dense_mlp_layers`, whose MLP is the dense one of `intermediate_size` (Qwen3-MoE's
`mlp_only_layers` and `decoder_sparse_step`); a dense model keeps the three counts at 0 and no
dense_mlp_layers. `check_experts` (ModelConfig's validation) holds whatever the family: the
counts all zero or all positive, top-k within the experts, dense_mlp_layers distinct layer
indices in increasing order (empty without experts), and a MoE model refuses
`batch_invariant` (the routing and the grouped matmul do not run through the fixed-tile GEMMs, so
a token's bits could depend on its batch): each is a ValueError naming it. Whether a family has
experts at all, and whether it may have dense layers, is its module's (models/families/):
`require_experts`, `require_every_layer_sparse`, `require_dense`. The dense MLP layers run a
`quantization` scheme as a dense model's MLP does.

The experts' weights (`expert_quantization`, this module the rule's one owner):

  "fp8_block"    `block_fp8_experts`: a block-wise fp8 checkpoint (Qwen3-FP8 / DeepSeek style,
                 128 x 128 blocks) keeps its experts in e4m3 with their block scales, whatever
                 `quantization` says of the attention projections; H and the experts' I must be
                 multiples of 128 (models/weights.py sets the field only then)
  "fp8_channel"  `quantization` "fp8" (W8A8): e4m3 experts with per-channel scales, quantized as
                 they load from a float checkpoint or taken as stored from a compressed-tensors
                 one
  "none"         otherwise: experts in the model dtype (another scheme quantizes the attention
                 projections only; stored 8-bit experts are dequantized as they load,
                 models/dequantized_loading.py)

fp8 experts run the W8A8 fp8 grouped matmul (models/fp8_experts.py). The routers always stay in
the model dtype.

Hub checkpoints name the expert count `num_experts` (Qwen3-MoE) or `num_local_experts` (Mixtral,
and what transformers 5 writes for both): `hf_expert_count` reads either. The routers'
auxiliary-loss fields (`router_aux_loss_coef`, `output_router_logits`, `router_jitter_noise`)
only matter in training and are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from jaxserve.config.require import require as _require
from jaxserve.config.require import require_bool

COUNTS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
EXPERT_QUANTIZATIONS = ("none", "fp8_channel", "fp8_block")
FP8_BLOCK = 128  # block_fp8_experts: the weight blocks' side


class ExpertFields(Protocol):
  """The ModelConfig fields the checks read."""

  architecture: str
  num_experts: int
  num_experts_per_tok: int
  moe_intermediate_size: int
  norm_topk_prob: bool
  dense_mlp_layers: tuple[int, ...]
  num_layers: int
  batch_invariant: bool
  tp_invariant_reductions: bool
  hidden_size: int
  block_fp8_experts: bool


def _positive_int(value: object) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_experts(c: ExpertFields) -> None:
  """ValueError naming the first MoE field that does not hold (module docstring)."""
  _check_dense_layers(c)
  require_bool(c.block_fp8_experts, "block_fp8_experts")
  if all(getattr(c, name) == 0 for name in COUNTS):
    _require(
      not c.dense_mlp_layers, "dense_mlp_layers", "must be empty for a model without experts"
    )
    _require(not c.block_fp8_experts, "block_fp8_experts", "needs a mixture of experts")
    return
  require_experts(c)
  _require(
    c.num_experts_per_tok <= c.num_experts,
    "num_experts_per_tok",
    f"must not exceed num_experts ({c.num_experts}), got {c.num_experts_per_tok}",
  )
  require_bool(c.norm_topk_prob, "norm_topk_prob")
  unsupported = "is not supported with mixture-of-experts layers (models/moe_config.py)"
  _require(not c.batch_invariant, "batch_invariant", unsupported)
  if c.block_fp8_experts:
    sizes = (c.hidden_size, c.moe_intermediate_size)
    _require(
      all(size % FP8_BLOCK == 0 for size in sizes),
      "block_fp8_experts",
      f"needs hidden_size and moe_intermediate_size multiples of {FP8_BLOCK}, got {sizes}",
    )
    _require(
      not c.tp_invariant_reductions,
      "block_fp8_experts",
      "fp8 experts cannot be combined with tp_invariant_reductions",
    )


def keeps_block_fp8_experts(c: ExpertFields, block: tuple[int, int]) -> bool:
  """Whether a block-wise fp8 checkpoint of `block` keeps its experts in fp8: a MoE with
  128 x 128 blocks and H, I multiples of 128 (else its experts load dequantized)."""
  sizes = (c.hidden_size, c.moe_intermediate_size)
  return (
    c.num_experts > 0
    and tuple(block) == (FP8_BLOCK, FP8_BLOCK)
    and all(size % FP8_BLOCK == 0 for size in sizes)
    and not c.tp_invariant_reductions
  )


def expert_quantization(quantization: str, block_fp8_experts: bool) -> str:
  """How a MoE model stores and runs its experts (EXPERT_QUANTIZATIONS; module docstring)."""
  if block_fp8_experts:
    return "fp8_block"
  return "fp8_channel" if quantization == "fp8" else "none"


def _check_dense_layers(c: ExpertFields) -> None:
  """dense_mlp_layers: distinct layer indices in increasing order."""
  layers = c.dense_mlp_layers
  _require(
    isinstance(layers, tuple)
    and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
    and list(layers) == sorted(set(layers))
    and all(0 <= i < c.num_layers for i in layers),
    "dense_mlp_layers",
    f"must be distinct layer indices in [0, {c.num_layers}) in increasing order, got {layers}",
  )


def require_experts(c: ExpertFields) -> None:
  """A MoE family's config: every count positive."""
  for name in COUNTS:
    value = getattr(c, name)
    _require(
      _positive_int(value), name, f"must be a positive integer for {c.architecture}, got {value!r}"
    )


def require_every_layer_sparse(c: ExpertFields) -> None:
  """A MoE family whose every layer routes to experts (no dense MLP layers)."""
  require_experts(c)
  _require(
    not c.dense_mlp_layers,
    "dense_mlp_layers",
    f"must be empty for {c.architecture} (every layer is sparse), got {c.dense_mlp_layers}",
  )


def require_dense(c: ExpertFields) -> None:
  """A dense family's config: no experts."""
  for name in COUNTS:
    value = getattr(c, name)
    _require(value == 0, name, f"must be 0 for {c.architecture}, got {value!r}")


def hf_expert_count(d: Mapping) -> int:
  """The expert count of a MoE config.json (`num_experts` or `num_local_experts`)."""
  counts = {d[name] for name in ("num_experts", "num_local_experts") if d.get(name) is not None}
  _require(len(counts) == 1, "num_experts", f"expected one expert count, got {sorted(counts)}")
  return counts.pop()
