"""investigations/triton_static.py's capture (the compile step needs a `triton` package, no
dependency here), and through it what the GPU attention kernel hands Triton for 8-bit pages:
every 8-bit K / V tile load carries its own fill for the masked rows (tt.load's third operand),
so no select sits between the load and the MMA. A select there keeps Triton from converting the
tile in the MMA operands' registers and round-trips each converted tile through shared memory
(docs/DECISIONS.md, "An 8-bit KV cache with static scales")."""

from __future__ import annotations

import re

import pytest

from investigations import triton_static


@pytest.mark.parametrize("dtype,ir_type", [("float8_e4m3fn", "f8E4M3FN"), ("int8", "i8")])
def test_8bit_tile_loads_carry_their_fill(dtype, ir_type):
  (module,) = triton_static.attention_modules(dtype, num_seqs=16, context=256)
  loads = re.findall(rf"tt\.load ([^:]+) : tensor<128x128x!tt\.ptr<{ir_type}>>", module)
  assert len(loads) == 2  # K and V
  assert all(len(operands.split(",")) == 3 for operands in loads), loads
  assert not re.search(r"arith\.select .*tensor<128x128xbf16>", module)


@pytest.mark.parametrize("programs", [0, 24])
def test_quantized_matmul_module_is_captured(programs):
  (module,) = triton_static.quantized_matmul_modules(256, 512, programs=programs)
  assert "tt.func" in module and "num_warps=4 num_stages=3" in module
  assert len(re.findall(r"tt\.dot ", module)) == 1  # the fp8 dot, grid or persistent
  assert ("scf.if" in module) == bool(programs)  # the persistent loop stores at a unit's end


def test_ops_are_counted_in_a_module_text():
  text = "ttg.local_alloc %1 ... ttg.local_alloc : () ... tt.dot %a ttg.local_load %x"
  assert triton_static.count_ops(text) == {
    "async_copies": 0,
    "shared_loads": 1,
    "register_to_shared": 1,
    "dots": 1,
  }
