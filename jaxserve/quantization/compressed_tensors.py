"""The compressed-tensors checkpoint format (what llm-compressor writes), read from a Hugging
Face config.json: which scheme its weights are stored in, or a one-line ValueError naming a
scheme this runtime does not run. No jax.

config.json's `quantization_config` (quant_method "compressed-tensors") holds `config_groups`,
each with `targets` (["Linear"]), `weights` and `input_activations` as QuantizationArgs
(num_bits, type "float" | "int", strategy, symmetric, dynamic, group_size), a `format`
("float-quantized", "int-quantized", "naive-quantized"; per group or for all) and an `ignore`
list of modules left unquantized. Each quantized Linear stores, beside its HF name:

  <module>.weight        [out, in] float8_e4m3fn or int8
  <module>.weight_scale  float32 or bfloat16, [out, 1] (strategy "channel") or [1] / []
                         ("tensor": one scale for the whole weight)
  <module>.input_scale   [1] / [] when input_activations are static (dynamic: absent)

Runs: one group of 8-bit symmetric weights, channel or tensor strategy, with no activation
quantization (W8A16) or 8-bit symmetric activations of the same type, dynamic (per token or
per tensor) or static per tensor (W8A8: the activations are scaled per token whatever the
checkpoint says, which is at least as accurate; a static input_scale is checked, not used),
and `ignore` naming no attention or dense MLP projection (lm_head stays in the model dtype
anyway; a MoE's routers and experts, quantized or not, load as floats in the model dtype, the
quantized ones dequantized with their weight_scale: models/dequantized_loading.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from jaxserve.quantization.block_fp8 import QUANT_METHOD as BLOCK_FP8_METHOD
from jaxserve.quantization.scheme import QuantScheme, scheme_named

QUANT_METHOD = "compressed-tensors"
FORMATS = {"float-quantized": "float", "int-quantized": "int", "naive-quantized": "int"}
STRATEGIES = ("channel", "tensor")
WEIGHT_DTYPES = {"float": "float8_e4m3fn", "int": "int8"}
SCALE_SUFFIX = ".weight_scale"
DENSE_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DENSE_PROJECTION_NAMES = tuple(
  f"model.layers.0.{module}.{name}"
  for module, names in (("self_attn", DENSE_PROJECTIONS[:4]), ("mlp", DENSE_PROJECTIONS[4:]))
  for name in names
)
INPUT_SCALE_SUFFIX = ".input_scale"


@dataclass(frozen=True)
class StoredQuantization:
  """How a compressed-tensors checkpoint stores its projections."""

  scheme: QuantScheme
  strategy: str  # "channel": weight_scale [out, 1]; "tensor": one scale, [1] or []
  static_input_scale: bool  # every projection also stores input_scale

  def __post_init__(self) -> None:
    if self.strategy not in STRATEGIES:
      raise ValueError(f"quantization_config.strategy: must be one of {STRATEGIES}")


def _fail(message: str) -> None:
  raise ValueError(f"quantization_config: {message}")


def _describe(args: Mapping) -> str:
  """A QuantizationArgs as people name it: 'int 4-bit group (group_size 128) asymmetric'."""
  words = [f"{args.get('type')} {args.get('num_bits')}-bit {args.get('strategy')}"]
  if args.get("group_size"):
    words.append(f"(group_size {args['group_size']})")
  if args.get("block_structure"):
    words.append(f"(block {args['block_structure']})")
  if not args.get("symmetric", True):
    words.append("asymmetric")
  return " ".join(words)


def _names_dense_projection(entry: object) -> bool:
  """Whether an `ignore` entry (a module name or "re:" pattern) names a projection jaxserve runs
  quantized (attention, dense MLP), which must then be stored quantized; lm_head, MoE routers
  and experts load as floats either way (models/dequantized_loading.py)."""
  if not isinstance(entry, str):
    return True
  if entry.startswith("re:"):
    return any(re.fullmatch(entry[3:], name) for name in DENSE_PROJECTION_NAMES)
  parts = entry.split(".")
  return len(parts) >= 2 and parts[-2] in ("self_attn", "mlp") and parts[-1] in DENSE_PROJECTIONS


def stored_quantization(hf_config: Mapping) -> StoredQuantization | None:
  """The scheme of a compressed-tensors checkpoint's config.json (None: not quantized, or
  block-wise fp8, which loads as floats)."""
  qc = hf_config.get("quantization_config")
  if qc is None:
    return None
  if not isinstance(qc, Mapping):
    _fail(f"must be a mapping, got {type(qc).__name__}")
  if qc.get("quant_method") == BLOCK_FP8_METHOD:
    return None  # loads dequantized (quantization/block_fp8.py), not as a stored scheme
  if qc.get("quant_method") != QUANT_METHOD:
    _fail(
      f"unsupported quant_method {qc.get('quant_method')!r} "
      f"(supported: {QUANT_METHOD}, {BLOCK_FP8_METHOD})"
    )
  groups = qc.get("config_groups")
  if not isinstance(groups, Mapping) or len(groups) != 1:
    count = len(groups) if isinstance(groups, Mapping) else 0
    _fail(f"config_groups: one group is supported, got {count}")
  ((name, group),) = groups.items()
  where = f"config_groups.{name}"
  if "Linear" not in (group.get("targets") or ()):
    _fail(f"{where}.targets: must include 'Linear', got {group.get('targets')!r}")
  weights, inputs = group.get("weights"), group.get("input_activations")
  if not isinstance(weights, Mapping):
    _fail(f"{where}.weights: missing")
  scheme_text = _describe(weights) + (f", activations {_describe(inputs)}" if inputs else "")
  kind = weights.get("type")
  if (
    weights.get("num_bits") != 8
    or kind not in WEIGHT_DTYPES
    or weights.get("strategy") not in STRATEGIES
    or not weights.get("symmetric", True)
    or weights.get("dynamic", False)
    or weights.get("group_size")
    or weights.get("block_structure")
  ):
    _fail(
      f"unsupported compressed-tensors scheme: weights {scheme_text} (supported: 8-bit float or "
      "int weights, channel or tensor strategy, symmetric)"
    )
  if inputs is not None and (
    inputs.get("num_bits") != 8
    or inputs.get("type") != kind
    or not inputs.get("symmetric", True)
    or inputs.get("strategy") not in ("token", "tensor")
    or (inputs.get("strategy") == "token" and inputs.get("dynamic") is not True)
  ):
    _fail(
      f"unsupported compressed-tensors scheme: weights {scheme_text} (supported activations: "
      "none, or 8-bit symmetric of the weights' type, dynamic per token or tensor, or static "
      "per tensor)"
    )
  if group.get("output_activations") is not None:
    _fail(f"{where}.output_activations: output quantization is not supported")
  fmt = group.get("format") or qc.get("format")
  if FORMATS.get(fmt) != kind:
    _fail(f"format: {fmt!r} does not store {kind} 8-bit weights (supported: {tuple(FORMATS)})")
  for entry in qc.get("ignore") or ():
    if _names_dense_projection(entry):
      _fail(
        f"ignore: {entry!r} leaves attention or dense MLP projections unquantized (only lm_head, "
        "MoE routers and experts may be)"
      )
  if qc.get("kv_cache_scheme") is not None:
    _fail("kv_cache_scheme: a quantized KV cache is not supported yet")
  return StoredQuantization(
    scheme_named(WEIGHT_DTYPES[kind], inputs is not None),
    weights["strategy"],
    inputs is not None and inputs.get("dynamic") is not True,
  )


def resolve_quantization(requested: str, stored: StoredQuantization | None) -> str:
  """The scheme a model runs: the checkpoint's when it is pre-quantized ("none" asks for
  nothing more; another name is an error), else the requested one (quantized on load)."""
  if stored is None or requested in ("none", stored.scheme.name):
    return stored.scheme.name if stored is not None else requested
  raise ValueError(
    f"quantization: the checkpoint is stored as {stored.scheme.describe()} (compressed-tensors); "
    f"it cannot be re-quantized to {requested!r} (use 'none' or {stored.scheme.name!r})"
  )
