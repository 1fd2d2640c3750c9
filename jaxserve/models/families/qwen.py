"""The dense Qwen family: Qwen2 (`Qwen2ForCausalLM`) and Qwen3 (`Qwen3ForCausalLM`).

Decoder: the Llama family's (models/families/llama.py). What differs is configuration: Qwen2's
q/k/v projections carry biases (`attention_bias`), Qwen3 normalizes each head's q and k with
RMSNorm before RoPE (`qk_norm`). Sliding windows (`sliding_window_config`, shared with
Qwen3-MoE): only when `use_sliding_window` and every layer slides (`layer_types`, or
`max_window_layers` full layers first); a mix of full and sliding layers is refused, naming
`layer_types`. Weights: the shared names, with the biases or q/k norms the config holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from jaxserve.config.require import require as _require
from jaxserve.models.families.family import ModelFamily
from jaxserve.models.families.llama import LlamaForCausalLM
from jaxserve.models.hf_fields import check_silu_mlp, common_fields
from jaxserve.models.hf_tensors import decoder_specs
from jaxserve.models.model_config import FULL, SLIDING
from jaxserve.models.moe_config import require_dense


def sliding_window_config(d: Mapping) -> int | None:
  """The window of a Qwen config.json (module docstring)."""
  if not d.get("use_sliding_window", False) or d.get("sliding_window") is None:
    return None
  layer_types = d.get("layer_types")
  if layer_types is None:
    num_full = d.get("max_window_layers", 0)
    layer_types = [FULL if i < num_full else SLIDING for i in range(d["num_hidden_layers"])]
  _require(
    all(t == SLIDING for t in layer_types),
    "layer_types",
    "mixing full and sliding-window attention layers is not supported",
  )
  return d["sliding_window"]


def config_fields(d: Mapping, architecture: str) -> dict[str, object]:
  check_silu_mlp(d)
  fields = common_fields(d) | dict(sliding_window=sliding_window_config(d))
  if architecture == "qwen2":
    return fields | dict(attention_bias=True)
  return fields | dict(qk_norm=True)


FAMILY = ModelFamily(
  name="qwen",
  architectures={"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"},
  config_fields=config_fields,
  check=require_dense,
  tensor_specs=decoder_specs,
  decoder=LlamaForCausalLM,
)
