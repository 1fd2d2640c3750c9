"""The fp8 layout of random-weight checkpoints (bench/random_checkpoint.py, `quantization="fp8"`):
compressed-tensors' FP8-dynamic scheme as llm-compressor saves it (the layout of downloads such as
RedHatAI's `*-FP8-dynamic` checkpoints), which jaxserve/quantization/compressed_tensors.py reads:

  <module>.weight        float8_e4m3fn [out, in]
  <module>.weight_scale  [out, 1] in the model dtype, one per output channel (weight ~= q * scale)

for every attention and dense MLP projection and every expert's projection; the embedding, the
norms, the MoE routers and lm_head stay in the model dtype, the routers and lm_head named (module
by module, as llm-compressor expands them) in `quantization_config.ignore`. Activations are
quantized dynamically per token (W8A8: jaxserve's `fp8` scheme). Each row's scale is amax / 448
(1 for a zero row) rounded to the model dtype, and the row is quantized by that stored scale as
the numpy reference does (jaxserve/quantization/reference.py `to_quantized`: w * (1 / scale),
clipped to +-448, rounded to nearest even), in torch on the tensor's device, so a tensor is
quantized where it is drawn and only its fp8 bytes and scales reach the host.
"""

from __future__ import annotations

from jaxserve.models.quantized_dense import is_quantized_kernel
from jaxserve.models.tensor_spec import TensorSpec
from jaxserve.quantization.compressed_tensors import QUANT_METHOD, SCALE_SUFFIX
from jaxserve.quantization.scheme import NONE, SCHEMES

SCHEME = SCHEMES["fp8"]
QUANTIZATIONS = (NONE, SCHEME.name)  # what random checkpoints may be written in


def is_fp8_weight(spec: TensorSpec) -> bool:
  """Whether the checkpoint stores `spec`'s tensor in fp8: an attention or dense MLP projection
  (the loader's quantized kernels, models/quantized_dense.py) or an expert's projection."""
  return is_quantized_kernel(spec.path) or spec.expert is not None


def ignored_modules(specs: list[TensorSpec]) -> list[str]:
  """The Linear modules left in the model dtype (routers, lm_head), by HF module name."""
  return [
    spec.hf_name.removesuffix(".weight")
    for spec in specs
    if spec.transpose and not is_fp8_weight(spec)
  ]


def _args(strategy: str, dynamic: bool) -> dict[str, object]:
  return {
    "num_bits": 8,
    "type": "float",
    "strategy": strategy,
    "symmetric": True,
    "dynamic": dynamic,
    "group_size": None,
    "block_structure": None,
    "actorder": None,
    "observer": None if dynamic else "minmax",
    "observer_kwargs": {},
  }


def quantization_config(specs: list[TensorSpec]) -> dict[str, object]:
  """config.json's `quantization_config` of a checkpoint with `specs`' tensors."""
  return {
    "quant_method": QUANT_METHOD,
    "format": "float-quantized",
    "quantization_status": "compressed",
    "global_compression_ratio": None,
    "config_groups": {
      "group_0": {
        "targets": ["Linear"],
        "weights": _args("channel", dynamic=False),
        "input_activations": _args("token", dynamic=True),
        "output_activations": None,
        "format": "float-quantized",
      }
    },
    "ignore": ignored_modules(specs),
    "kv_cache_scheme": None,
  }


def quantize_fp8(weight, hf_name: str) -> dict[str, object]:
  """A float torch weight [out, in] -> {hf_name: fp8 weight, scale name: scale [out, 1]} (the
  scale in the weight's dtype), on the weight's device."""
  import torch

  w = weight.float()
  amax = w.abs().amax(dim=1, keepdim=True)
  scale = torch.where(amax > 0, amax * (1.0 / SCHEME.max_value), torch.ones_like(amax))
  scale = scale.to(weight.dtype)  # stored as published, and what the weight means
  q = (w * (1.0 / scale.float())).clamp(-SCHEME.max_value, SCHEME.max_value)
  module = hf_name.removesuffix(".weight")
  return {hf_name: q.to(torch.float8_e4m3fn), module + SCALE_SUFFIX: scale}
