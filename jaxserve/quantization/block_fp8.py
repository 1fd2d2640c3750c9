"""The block-wise fp8 checkpoint format (DeepSeek-V3, Qwen3-*-FP8; transformers'
FineGrainedFP8Config), read from a Hugging Face config.json. No jax.

config.json's `quantization_config` has quant_method "fp8", fmt "e4m3", activation_scheme
"dynamic" and `weight_block_size` [128, 128] (rows of `out` by columns of `in`);
`modules_to_not_convert` lists the Linears left in the model dtype (lm_head, the MoE routers).
Each quantized Linear stores, beside its HF name:

  <module>.weight            [out, in] float8_e4m3fn
  <module>.weight_scale_inv  float32 [ceil(out / 128), ceil(in / 128)]

and means weight = float(q) * scale_inv of its block (the last row / column of blocks is partial
when a dimension is not a multiple of the block). Which tensors are quantized is read from the
files' headers (an e4m3 `weight`), not from the module list. jaxserve dequantizes them as they
load (jaxserve/models/dequantized_loading.py, docs/DECISIONS.md "Block-wise fp8 checkpoints").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

QUANT_METHOD = "fp8"
SCALE_SUFFIX = ".weight_scale_inv"
WEIGHT_DTYPE = "float8_e4m3fn"


@dataclass(frozen=True)
class BlockFp8:
  """A block-wise fp8 checkpoint's block: `rows` of out by `cols` of in per scale."""

  rows: int
  cols: int

  def __post_init__(self) -> None:
    for name in ("rows", "cols"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
          f"quantization_config.weight_block_size: must be two positive integers, got {value!r}"
        )

  @property
  def block(self) -> tuple[int, int]:
    return (self.rows, self.cols)

  def scale_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, int]:
    """weight_scale_inv's shape for a weight [out, in]: one scale per (partial) block."""
    out, inner = weight_shape
    return (-(-out // self.rows), -(-inner // self.cols))


def _fail(message: str) -> None:
  raise ValueError(f"quantization_config.{message}")


def block_fp8(hf_config: Mapping) -> BlockFp8 | None:
  """The block of a block-wise fp8 checkpoint's config.json (None: another or no quant_method);
  a ValueError naming the field for a variant this runtime does not read."""
  qc = hf_config.get("quantization_config")
  if not isinstance(qc, Mapping) or qc.get("quant_method") != QUANT_METHOD:
    return None
  if qc.get("fmt", "e4m3") != "e4m3":
    _fail(f"fmt: only 'e4m3' is supported, got {qc.get('fmt')!r}")
  if qc.get("activation_scheme", "dynamic") != "dynamic":
    _fail(f"activation_scheme: only 'dynamic' is supported, got {qc.get('activation_scheme')!r}")
  block = qc.get("weight_block_size")
  if not isinstance(block, (list, tuple)) or len(block) != 2:
    _fail(
      f"weight_block_size: must be [rows, cols] (per-tensor fp8 is not supported), got {block!r}"
    )
  return BlockFp8(*block)
