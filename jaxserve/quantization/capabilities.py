"""Which quantization schemes a device runs: the one owner of that rule, a pure function of a
small description of the device (no jax; the engine describes its device and asks before any
weight or KV page takes device memory, jaxserve/composition/assembly.py).

Weight-only schemes (fp8_w8a16, int8; "none") run everywhere: the 8-bit weight is converted to
the activations' type inside the GEMM. A W8A8 scheme multiplies 8-bit operands, which only pays
on matrix units of that type; elsewhere XLA still compiles the GEMM but runs it at the
bfloat16 rate with the activations' rounding on top, so it is refused, naming the weight-only
scheme that stores the same weights:

  fp8 (e4m3 W8A8)   NVIDIA compute capability >= 8.9 (Ada, Hopper and newer: fp8 tensor
                    cores); TPU7x (Ironwood). Not TPU v4, v5e, v5p, v6e.
  int8_w8a8         NVIDIA compute capability >= 7.5 (int8 tensor cores since Turing); TPU v5e,
                    v5p, v6e (int8 MXU). Not TPU v4, TPU7x.
  either            CPU: XLA:CPU computes every scheme (the tests' platform).

The TPU rows follow libtpu's own cost model for each chip (docs/DECISIONS.md, "W8A8 only where
the device has 8-bit matrix units"). A GPU whose compute capability is not NVIDIA's
"major.minor" (ROCm) and a TPU chip not in TPU_CHIPS run the weight-only schemes only.
"""

from __future__ import annotations

from jaxserve.quantization.scheme import QuantScheme, scheme_for, scheme_named
from jaxserve.runtime.device_description import TPU_CHIPS, DeviceDescription

# W8A8 weight dtype -> (least NVIDIA compute capability, TPU chips with such matrix units)
W8A8_UNITS = {
  "float8_e4m3fn": ((8, 9), ("TPU7x",)),
  "int8": ((7, 5), ("v5e", "v5p", "v6e")),
}


def refusal(scheme: QuantScheme, device: DeviceDescription) -> str | None:
  """Why `device` does not run `scheme` (None: it does)."""
  if not scheme.quantize_activations or device.platform == "cpu":
    return None
  least, chips = W8A8_UNITS[scheme.weight_dtype]
  kind = "fp8" if scheme.is_float else "int8"
  if device.platform == "gpu":
    capability = device.nvidia_capability()
    if capability is not None and capability >= least:
      return None
    needs = f"{kind} tensor cores (NVIDIA compute capability >= {least[0]}.{least[1]})"
  else:
    if TPU_CHIPS.get(device.device_kind) in chips:
      return None
    named = (chip if chip.startswith("TPU") else f"TPU {chip}" for chip in chips)
    needs = f"{kind} matrix units ({', '.join(named)})"
  return (
    f"{scheme.describe()} needs {needs}, which {device.name()} lacks; use "
    f"{scheme_named(scheme.weight_dtype, False).name} (the same weights, activations unquantized)"
  )


def check_device_runs(quantization: str, device: DeviceDescription) -> None:
  """A one-line ValueError naming `quantization` when `device` does not run it."""
  scheme = scheme_for(quantization)
  reason = None if scheme is None else refusal(scheme, device)
  if reason is not None:
    raise ValueError(f"quantization: {reason}")
