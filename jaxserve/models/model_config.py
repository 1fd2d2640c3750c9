"""The architecture of a decoder-only model, as a frozen, validated dataclass.

One `ModelConfig` describes every supported family (models/families/: Llama 2/3, Mistral, Qwen2,
Qwen3, Gemma 2, Gemma 3, and the mixtures of experts Qwen3-MoE and Mixtral) as shapes and
structural fields: q/k/v bias, per-head q/k norms, windows and per-layer attention types, RoPE
scaling and a local RoPE base, the attention scale and soft caps, tied embeddings, routed
experts. `architecture` names the family's architecture (its `model_type`, e.g. "llama",
"gemma3_text"); what the family itself decides (its norm, activation, layer, embedding scale,
which fields it may set) is its module's (models/families/), and `families.family_of(config)`
checks a config against it. A family's module maps a Hugging Face `config.json` onto these
fields (models/hf_config.py assembles them).

Validation here is the family-independent part: it refuses, with a ValueError naming the field,
any value the model code does not implement, so an unsupported checkpoint fails at load time
rather than producing wrong logits.

Mixture of experts (`num_experts` > 0): models/moe_config.py validates those fields. Layer i's
MLP is the routed experts unless i is in `dense_mlp_layers` (a dense MLP of `intermediate_size`),
as `is_moe_layer(i)` says.

Attention windows: with `layer_types` empty every layer attends over `sliding_window` (None: the
whole context; Mistral); otherwise layer i is "sliding_attention" (window `sliding_window`) or
"full_attention" (the whole context), as `layer_window(i)` says.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jaxserve.config.kernel_choices import KernelChoice
from jaxserve.config.require import require as _require
from jaxserve.config.require import require_bool
from jaxserve.models.moe_config import check_experts, expert_quantization
from jaxserve.quantization.scheme import NONE, check_quantization

SLIDING, FULL = "sliding_attention", "full_attention"
LAYER_TYPES = (SLIDING, FULL)
DTYPES = ("float32", "bfloat16")
ROPE_TYPES = ("llama3", "linear")


def _positive_int(value: object) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class RopeScaling:
  """RoPE frequency scaling. "linear" divides every frequency by `factor`; "llama3" is Llama 3.1's
  wavelength-dependent scaling (low_freq_factor, high_freq_factor,
  original_max_position_embeddings)."""

  rope_type: str
  factor: float
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int | None = None

  def __post_init__(self) -> None:
    _require(
      self.rope_type in ROPE_TYPES,
      "rope_scaling.rope_type",
      f"unsupported rope type {self.rope_type!r} (supported: {', '.join(ROPE_TYPES)})",
    )
    _require(float(self.factor) > 0, "rope_scaling.factor", f"must be > 0, got {self.factor!r}")
    if self.rope_type == "llama3":
      _require(
        float(self.high_freq_factor) > float(self.low_freq_factor) > 0,
        "rope_scaling.high_freq_factor",
        f"must exceed low_freq_factor > 0, got {self.high_freq_factor!r}, {self.low_freq_factor!r}",
      )
      _require(
        _positive_int(self.original_max_position_embeddings),
        "rope_scaling.original_max_position_embeddings",
        f"must be a positive integer, got {self.original_max_position_embeddings!r}",
      )


@dataclass(frozen=True)
class ModelConfig:
  """Shapes and structural fields of a decoder-only transformer (module docstring)."""

  architecture: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_q_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  max_position_embeddings: int = 2048
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  qk_norm: bool = False
  sliding_window: int | None = None
  layer_types: tuple[str, ...] = ()  # per layer, LAYER_TYPES; () = every layer sliding_window
  query_pre_attn_scalar: float | None = None  # softmax scale this ** -0.5; None: head_dim's
  attn_logit_softcapping: float | None = None  # scores -> cap * tanh(scores / cap)
  final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap)
  rope_local_base_freq: float | None = None  # sliding layers' RoPE base, unscaled (Gemma 3)
  num_experts: int = 0  # MoE: routed experts per layer (0: a dense MLP)
  num_experts_per_tok: int = 0  # MoE: the top-k experts each token is routed to
  moe_intermediate_size: int = 0  # MoE: each expert's intermediate size
  norm_topk_prob: bool = False  # MoE: renormalize the top-k routing probabilities to sum to one
  dense_mlp_layers: tuple[int, ...] = ()  # MoE: the layers whose MLP is dense (intermediate_size)
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  dtype: str = "float32"
  tp_invariant_reductions: bool = False  # projections as tp=2 GEMMs (invariant_dense.py)
  fused_projections: bool = False  # qkv_proj / gate_up_proj params (fused_projections.py)
  batch_invariant: bool = False  # fixed-order norms (pallas_kernels/fixed_order.py); engine-set
  quantization: str = NONE  # the projections' weight scheme (jaxserve/quantization/scheme.py)
  # EngineConfig.quantized_gemm resolved (XLA or PALLAS_GPU: <= 16-token steps on the Pallas
  # kernel); engine-set
  quantized_gemm: KernelChoice = KernelChoice.XLA
  block_fp8_experts: bool = False  # MoE: experts stored block-wise fp8, kept so (moe_config.py)

  def __post_init__(self) -> None:
    _require(
      isinstance(self.architecture, str) and bool(self.architecture),
      "architecture",
      f"must name an architecture (models/families/), got {self.architecture!r}",
    )
    for name in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_q_heads",
      "num_kv_heads",
      "head_dim",
      "max_position_embeddings",
    ):
      _require(
        _positive_int(getattr(self, name)),
        name,
        f"must be a positive integer, got {getattr(self, name)!r}",
      )
    _require(
      self.num_q_heads % self.num_kv_heads == 0,
      "num_kv_heads",
      f"must divide num_q_heads ({self.num_q_heads}), got {self.num_kv_heads}",
    )
    _require(self.head_dim % 2 == 0, "head_dim", f"must be even for RoPE, got {self.head_dim}")
    _require(
      float(self.rms_norm_eps) > 0, "rms_norm_eps", f"must be > 0, got {self.rms_norm_eps!r}"
    )
    _require(float(self.rope_theta) > 0, "rope_theta", f"must be > 0, got {self.rope_theta!r}")
    _require(
      self.sliding_window is None or _positive_int(self.sliding_window),
      "sliding_window",
      f"must be a positive integer or None, got {self.sliding_window!r}",
    )
    self._check_layers()
    _require(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
    require_bool(self.tp_invariant_reductions, "tp_invariant_reductions")
    require_bool(self.batch_invariant, "batch_invariant")
    _require(
      not (self.fused_projections and self.tp_invariant_reductions),
      "fused_projections",
      "cannot be combined with tp_invariant_reductions (which keeps per-device GEMMs)",
    )
    check_quantization(self.quantization)
    _require(
      self.quantized_gemm in (KernelChoice.XLA, KernelChoice.PALLAS_GPU),
      "quantized_gemm",
      f"must be KernelChoice.XLA or KernelChoice.PALLAS_GPU, got {self.quantized_gemm!r}",
    )
    _require(
      self.quantization == NONE or not (self.tp_invariant_reductions or self.batch_invariant),
      "quantization",
      f"{self.quantization} cannot be combined with tp_invariant_reductions or batch_invariant",
    )
    check_experts(self)
    eos = tuple(self.eos_token_ids)
    object.__setattr__(self, "eos_token_ids", eos)
    for token_id in eos + (() if self.bos_token_id is None else (self.bos_token_id,)):
      _require(
        isinstance(token_id, int) and 0 <= token_id < self.vocab_size,
        "eos_token_ids",
        f"special token ids must be in [0, {self.vocab_size}), got {token_id!r}",
      )

  @property
  def expert_quantization(self) -> str:
    """The experts' weights: "none", "fp8_channel" or "fp8_block" (models/moe_config.py)."""
    if not self.num_experts:
      return "none"
    return expert_quantization(self.quantization, self.block_fp8_experts)

  def _check_layers(self) -> None:
    layer_types = tuple(self.layer_types)
    object.__setattr__(self, "layer_types", layer_types)
    if isinstance(self.dense_mlp_layers, list):
      object.__setattr__(self, "dense_mlp_layers", tuple(self.dense_mlp_layers))
    _require(
      not layer_types or len(layer_types) == self.num_layers,
      "layer_types",
      f"must name {self.num_layers} layers, got {len(layer_types)}",
    )
    for layer_type in layer_types:
      _require(
        layer_type in LAYER_TYPES,
        "layer_types",
        f"each must be one of {LAYER_TYPES}, got {layer_type!r}",
      )
    _require(
      SLIDING not in layer_types or self.sliding_window is not None,
      "sliding_window",
      "sliding_attention layers need a window",
    )
    for name in (
      "query_pre_attn_scalar",
      "attn_logit_softcapping",
      "final_logit_softcapping",
      "rope_local_base_freq",
    ):
      value = getattr(self, name)
      _require(
        value is None or (not isinstance(value, bool) and float(value) > 0),
        name,
        f"must be > 0 or None, got {value!r}",
      )

  @property
  def sm_scale(self) -> float:
    """The attention logits' scale."""
    scalar = self.head_dim if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar
    return float(scalar) ** -0.5

  def is_sliding(self, layer: int) -> bool:
    """Whether layer `layer` attends over a window (see the module docstring)."""
    if not self.layer_types:
      return self.sliding_window is not None
    return self.layer_types[layer] == SLIDING

  def layer_window(self, layer: int) -> int | None:
    """Layer `layer`'s attention window (None: the whole context)."""
    return self.sliding_window if self.is_sliding(layer) else None

  def uses_local_rope(self, layer: int) -> bool:
    """Whether layer `layer` rotates by the local base (rope_local_base_freq,
    models/layers/rope.py)."""
    return self.rope_local_base_freq is not None and self.is_sliding(layer)

  def is_moe_layer(self, layer: int) -> bool:
    """Whether layer `layer`'s MLP is the routed experts (else a dense MLP)."""
    return self.num_experts > 0 and layer not in self.dense_mlp_layers

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)
