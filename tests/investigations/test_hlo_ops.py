"""hlo_ops on real compiled modules: every instruction a CPU trace names is found with its
opcode, result shape and the JAX op path of its metadata."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from investigations.device_trace import capture_trace, summarize_trace
from investigations.hlo_ops import HloInstruction, describe, instructions


def _program():
  def f(x, w):
    with jax.named_scope("proj"):
      y = x @ w  # [64, 256]
    return jnp.tanh(y) * 2

  args = (jnp.ones((64, 128), jnp.float32), jnp.ones((128, 256), jnp.float32))
  return jax.jit(f), args


def test_instructions_of_a_compiled_module():
  fn, args = _program()
  table = instructions(fn.lower(*args).compile().as_text())
  dots = [i for i in table.values() if i.op_name.endswith("proj/dot_general")]
  assert dots and all(i.shape == "f32[64,256]" for i in dots)
  params = [i for i in table.values() if i.opcode == "parameter"]
  assert sorted(i.shape for i in params if i.op_name in ("x", "w")) == [
    "f32[128,256]",
    "f32[64,128]",
  ]


def test_every_traced_op_is_described(tmp_path):
  fn, args = _program()
  table = instructions(fn.lower(*args).compile().as_text())
  rows = summarize_trace(capture_trace(lambda: fn(*args), tmp_path, reps=2), by_op=True)
  described = [describe(row.name, table) for row in rows]
  assert all(described), [row.name for row, d in zip(rows, described, strict=True) if d is None]
  assert any("proj/dot_general" in d.op_name for d in described)


def test_gpu_kernel_spelling_and_tuples():
  text = (
    "  %fusion.3 = bf16[512,3072]{1,0} fusion(%p.1, %p.2), kind=kCustom, "
    'metadata={op_name="jit(step)/q_proj/dot_general"}\n'
    "  ROOT %tuple.9 = (f32[8]{0}, s32[8]{0}) tuple(%a, %b)\n"
  )
  table = instructions(text)
  assert describe("fusion_3", table) == HloInstruction(
    "fusion.3", "fusion", "bf16[512,3072]", "jit(step)/q_proj/dot_general"
  )
  assert table["tuple.9"].shape == "(f32[8], s32[8])" and table["tuple.9"].op_name == ""
  assert describe("nvjet_sm90_tst_128x128", table) is None
