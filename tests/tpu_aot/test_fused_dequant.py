"""Dequantization fused into the GEMM on a TPU, shown in libtpu's optimized HLO: every scheme's
projection (jaxserve/quantization/matmul.py) compiled for a v5e chip reads the 8-bit weight
straight into the dot's fusion; no instruction writes a weight-sized array of any other type
(a dequantized copy). Compile-only, no TPU needed (the GPU side: the Pallas kernel,
tests/pallas_kernels/test_quantized_matmul.py)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from jaxserve.quantization.matmul import quantized_matmul
from jaxserve.quantization.scheme import SCHEMES
from jaxserve.tpu_aot.chips import libtpu_available, topology_devices

pytestmark = pytest.mark.skipif(not libtpu_available(), reason="needs libtpu (the test extra)")
N, K = 6144, 4096  # Llama-3.1-8B's merged q/k/v projection, [out, in]
HLO_TYPES = {"int8": "s8", "float8_e4m3fn": "f8e4m3fn"}


@pytest.fixture(scope="module")
def v5e():
  return topology_devices("v5e:2x2")[0]


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_the_weight_is_read_in_8_bits_by_the_dot(v5e, name):
  scheme = SCHEMES[name]
  sharding = jax.sharding.SingleDeviceSharding(v5e)
  args = (
    jax.ShapeDtypeStruct((8, K), jnp.bfloat16, sharding=sharding),
    jax.ShapeDtypeStruct((N, K), jnp.dtype(scheme.weight_dtype), sharding=sharding),
    jax.ShapeDtypeStruct((N,), jnp.float32, sharding=sharding),
  )
  fn = jax.jit(lambda x, w, scale: quantized_matmul(x, w, scale, scheme))
  entry = fn.lower(*args).compile().as_text().split("ENTRY", 1)[1]
  weight_sized = re.findall(rf"= (\w+)\[{N},{K}\]", entry)
  assert weight_sized and set(weight_sized) == {HLO_TYPES[scheme.weight_dtype]}, weight_sized
  dot = [line for line in entry.splitlines() if "dot_general" in line and " fusion(" in line]
  assert len(dot) == 1 and f"{HLO_TYPES[scheme.weight_dtype]}[{N},{K}]" not in dot[0].split("=")[0]
