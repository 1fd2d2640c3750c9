"""The quantization schemes, by name: the one table of what `quantization` (EngineConfig,
ModelConfig, `--quantization`) may say, and the one validation of it. No jax.

Every scheme stores each projection's weight as 8-bit values with one float32 scale per output
channel, symmetric (w ~= q * scale, q in [-max, max]); what differs is the weight's type and
whether the activations are quantized too:

  none         bfloat16 / float32 weights (the model's dtype), no scales
  fp8          e4m3 weights (max 448), dynamic per-token e4m3 activations: W8A8, the GEMM on fp8
               operands with float32 accumulation
  fp8_w8a16    e4m3 weights, activations in the model's dtype: weight-only fp8, for devices
               without fp8 units (the weight is converted inside the GEMM)
  int8         int8 weights (max 127), activations in the model's dtype: weight-only W8A16
  int8_w8a8    int8 weights, dynamic per-token int8 activations, int32 accumulation

Embeddings, norms, biases and lm_head keep the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

NONE = "none"
WEIGHT_DTYPES = {"float8_e4m3fn": 448.0, "int8": 127.0}  # dtype name -> largest magnitude


@dataclass(frozen=True)
class QuantScheme:
  """A weight scheme: `weight_dtype` (a WEIGHT_DTYPES name) with per-output-channel float32
  scales; `quantize_activations`: the activations are quantized per token to the same type
  (W8A8), else they stay in the model's dtype (W8A16)."""

  name: str
  weight_dtype: str
  quantize_activations: bool

  def __post_init__(self) -> None:
    if self.weight_dtype not in WEIGHT_DTYPES:
      raise ValueError(
        f"quantization.weight_dtype: must be one of {tuple(WEIGHT_DTYPES)}, "
        f"got {self.weight_dtype!r}"
      )
    if not isinstance(self.quantize_activations, bool):
      raise ValueError(
        f"quantization.quantize_activations: must be true or false, "
        f"got {self.quantize_activations!r}"
      )

  @property
  def max_value(self) -> float:
    """The largest quantized magnitude: 448 for e4m3, 127 for int8."""
    return WEIGHT_DTYPES[self.weight_dtype]

  @property
  def is_float(self) -> bool:
    return self.weight_dtype.startswith("float")

  def describe(self) -> str:
    kind = "fp8 e4m3" if self.is_float else "int8"
    return f"{self.name} ({kind} weights, {'W8A8' if self.quantize_activations else 'W8A16'})"


SCHEMES: dict[str, QuantScheme] = {
  scheme.name: scheme
  for scheme in (
    QuantScheme("fp8", "float8_e4m3fn", True),
    QuantScheme("fp8_w8a16", "float8_e4m3fn", False),
    QuantScheme("int8", "int8", False),
    QuantScheme("int8_w8a8", "int8", True),
  )
}
QUANTIZATION_NAMES: tuple[str, ...] = (NONE,) + tuple(SCHEMES)


def check_quantization(name: object) -> str:
  """`name` if it is one of QUANTIZATION_NAMES, else a one-line ValueError naming it."""
  if not isinstance(name, str) or name not in QUANTIZATION_NAMES:
    raise ValueError(f"quantization: must be one of {QUANTIZATION_NAMES}, got {name!r}")
  return name


def scheme_for(name: str) -> QuantScheme | None:
  """The scheme called `name` (None for "none"); ValueError for an unknown name."""
  return None if check_quantization(name) == NONE else SCHEMES[name]


def scheme_named(weight_dtype: str, quantize_activations: bool) -> QuantScheme:
  """The table's scheme with this weight type and activation rule."""
  for scheme in SCHEMES.values():
    if (scheme.weight_dtype, scheme.quantize_activations) == (weight_dtype, quantize_activations):
      return scheme
  raise ValueError(
    f"quantization: no scheme with {weight_dtype} weights and "
    f"{'quantized' if quantize_activations else 'unquantized'} activations"
  )
