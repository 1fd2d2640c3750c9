"""What an 8-bit GEMM costs on each TPU chip, from libtpu's own cost model, on any host: one
[M, K] x [N, K] dot_general (K contracted, the quantized kernels' [out, in] layout) compiled for
a one-host topology of each chip, and the `estimated_cycles` of its fusion, for bfloat16,
fp8 x fp8 and int8 x int8 (W8A8) and bfloat16 x fp8 / int8 (W8A16: the weight converted in the
dot). The evidence behind jaxserve/quantization/capabilities.py's TPU rows (docs/DECISIONS.md,
"W8A8 only where the device has 8-bit matrix units").

    python -m investigations.tpu_8bit_dots --chips v4:2x2x1 v5e:2x2 v5p:2x2x1 v6e:2x2 tpu7x:2x2x1

Needs libtpu (the test extra); compiles only, runs nothing. Small shapes understate the gaps
(fixed costs): the table in docs/DECISIONS.md uses the default 2048 x 4096 x 4096.
"""

from __future__ import annotations

import argparse
import re

import jax
import jax.numpy as jnp

from jaxserve.tpu_aot.chips import topology_devices

FORMS = {  # name -> (activation dtype, weight dtype, accumulation)
  "bfloat16": (jnp.bfloat16, jnp.bfloat16, jnp.float32),
  "fp8 x fp8": (jnp.float8_e4m3fn, jnp.float8_e4m3fn, jnp.float32),
  "int8 x int8": (jnp.int8, jnp.int8, jnp.int32),
  "bfloat16 x fp8": (jnp.bfloat16, jnp.float8_e4m3fn, jnp.float32),
  "bfloat16 x int8": (jnp.bfloat16, jnp.int8, jnp.float32),
}


def estimated_cycles(device, m: int, n: int, k: int, form: str) -> int:
  """libtpu's estimate for the dot's fusion (the sum if it made several)."""
  x_dtype, w_dtype, accumulate = FORMS[form]
  sharding = jax.sharding.SingleDeviceSharding(device)

  def dot(x, w):
    return jax.lax.dot_general(
      x, w.astype(x.dtype), (((1,), (1,)), ((), ())), preferred_element_type=accumulate
    )

  compiled = (
    jax.jit(dot)
    .lower(
      jax.ShapeDtypeStruct((m, k), x_dtype, sharding=sharding),
      jax.ShapeDtypeStruct((n, k), w_dtype, sharding=sharding),
    )
    .compile()
  )
  return sum(int(c) for c in re.findall(r'"estimated_cycles":"(\d+)"', compiled.as_text()))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--chips", nargs="+", default=["v5e:2x2", "v6e:2x2"], help="topologies")
  parser.add_argument("--shape", nargs=3, type=int, default=[2048, 4096, 4096], help="M N K")
  args = parser.parse_args(argv)
  jax.config.update("jax_enable_compilation_cache", False)  # topology executables: not cached
  print("| chip (device kind) | " + " | ".join(FORMS) + " |")
  print("|---|" + "---:|" * len(FORMS))
  for topology in args.chips:
    device = topology_devices(topology)[0]
    cycles = [estimated_cycles(device, *args.shape, form) for form in FORMS]
    print(f"| {topology} (`{device.device_kind}`) | " + " | ".join(f"{c:,}" for c in cycles) + " |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
