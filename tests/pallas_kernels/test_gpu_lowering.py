"""The GPU kernels lower for CUDA on a machine without a GPU.

Lowering runs the whole Pallas -> Triton IR translation of the kernel bodies (shapes, gathers,
masks, loops), so a construct the Triton backend cannot express fails here rather than on the
GPU. JAX >= 0.11 asks for the target GPU through an abstract mesh device.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models.fp8_experts import Fp8Weights
from jaxserve.models.grouped_matmul import expert_ffn
from jaxserve.models.layers.moe import SparseMoeBlock
from jaxserve.models.tiny_random import tiny_random_config
from jaxserve.parallel.partition_rules import MODEL_AXIS
from jaxserve.parallel.sharded_experts import shard_experts
from pallas_kernels.greedy_sample.gpu import greedy_sample
from pallas_kernels.ragged_paged_attention.gpu.attention import ragged_paged_attention, write_kv
from pallas_kernels.ragged_paged_attention.testing import (
  attention_args,
  make_random_case,
  quantize_pages,
  write_args,
)

TRITON_CALL_TARGET = "__gpu$xla.gpu.triton"


def _target_gpu():
  """Context naming an H100 as the lowering target where JAX supports abstract devices."""
  device_cls = getattr(jax.sharding, "AbstractDevice", None)
  if device_cls is None or not hasattr(jax.sharding, "use_abstract_mesh"):
    return contextlib.nullcontext()
  device = device_cls(device_kind="NVIDIA H100", num_cores=132, platform="gpu")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  return jax.sharding.use_abstract_mesh(mesh)


def _lower_for_cuda(fn, *args, **jit_kwargs) -> str:
  with _target_gpu():
    lowered = jax.jit(fn, **jit_kwargs).trace(*args).lower(lowering_platforms=("cuda",))
  return lowered.as_text()


def _custom_call_targets(text: str) -> set[str]:
  return set(re.findall(r"custom_call @([^(\s]+)\(", text))


def _case(dtype, head_dim: int, page_size: int, num_q_heads: int, num_kv_heads: int):
  return make_random_case(
    np.random.default_rng(0),
    num_seqs=4,
    q_lens=[1, 7, 1],
    kv_lens=[40, 7, 100],
    num_q_heads=num_q_heads,
    num_kv_heads=num_kv_heads,
    head_dim=head_dim,
    page_size=page_size,
    dtype=dtype,
    num_tokens=12,
  )


@pytest.mark.parametrize(
  "dtype,head_dim,page_size,num_q_heads,num_kv_heads,options",
  [
    (jnp.bfloat16, 128, 16, 32, 8, {}),
    (jnp.float32, 64, 32, 4, 4, {"sliding_window": 8, "soft_cap": 20.0}),
    (jnp.bfloat16, 256, 64, 12, 1, {"block_kv": 16}),
    (jnp.bfloat16, 128, 16, 32, 8, {"num_kv_splits": 4}),
  ],
)
def test_attention_lowers_to_triton(dtype, head_dim, page_size, num_q_heads, num_kv_heads, options):
  case = _case(dtype, head_dim, page_size, num_q_heads, num_kv_heads)
  fn = functools.partial(ragged_paged_attention, sm_scale=head_dim**-0.5, **options)
  text = _lower_for_cuda(fn, *attention_args(case))
  assert TRITON_CALL_TARGET in _custom_call_targets(text)
  assert 'name = "ragged_paged_attention"' in text


def test_write_kv_lowers_to_triton_in_place():
  case = _case(jnp.bfloat16, 128, 16, 8, 2)
  text = _lower_for_cuda(write_kv, *write_args(case), donate_argnums=(0, 1))
  assert TRITON_CALL_TARGET in _custom_call_targets(text)
  # The pages alias the kernel outputs, and the donated jit arguments alias the jit outputs.
  assert "output_operand_aliases" in text
  assert text.count("tf.aliasing_output") == 2


@pytest.mark.parametrize("vocab_size,block_vocab,num_splits", [(128256, 4096, 4), (1000, 256, 1)])
def test_greedy_sample_lowers_to_triton(vocab_size, block_vocab, num_splits):
  logits = jnp.zeros((8, vocab_size), jnp.float32)
  banned_ids = jnp.full((8, 8), -1, jnp.int32)
  text = _lower_for_cuda(
    functools.partial(greedy_sample, block_vocab=block_vocab, num_splits=num_splits, num_stages=2),
    logits,
    banned_ids,
  )
  assert TRITON_CALL_TARGET in _custom_call_targets(text)
  assert 'name = "greedy_sample"' in text


@pytest.mark.parametrize("kv_dtype", [jnp.float8_e4m3fn, jnp.int8], ids=["fp8", "int8"])
def test_8bit_kv_lowers_to_triton(kv_dtype):
  """8-bit pages: the attention's tile loads and casts, and the write's 8-bit stores."""
  case = quantize_pages(_case(jnp.bfloat16, 128, 16, 32, 8), kv_dtype, 0.5, 0.25)
  scales = dict(k_scale=0.5, v_scale=0.25)
  fn = functools.partial(ragged_paged_attention, sm_scale=128**-0.5, **scales)
  assert TRITON_CALL_TARGET in _custom_call_targets(_lower_for_cuda(fn, *attention_args(case)))
  text = _lower_for_cuda(functools.partial(write_kv, **scales), *write_args(case))
  assert TRITON_CALL_TARGET in _custom_call_targets(text)


@pytest.mark.parametrize("num_tokens", [1, 64, 8192], ids=["decode1", "decode64", "prefill8k"])
def test_moe_layer_lowers_to_the_grouped_matmul_kernel(num_tokens):
  """A Qwen3-30B-A3B MoE layer's experts (E 128, H 2048, I 768, top 8) as the model runs them
  (models/grouped_matmul.expert_ffn, kernel "auto"): for CUDA, the routing kernel and two
  grouped-matmul calls (gate/up fused with the rows gathered, down with its rows scattered) and
  no ragged_dot, which XLA's GPU compiler expands to a dense [M, E, N] product of every expert,
  nor any other [M, E, ...] array, nor a sort, scatter or gather."""
  text = _lower_for_cuda(expert_ffn, *_moe_args(num_tokens))
  _assert_grouped_matmul_kernels(text, num_tokens * 8, 128)


def _moe_args(num_tokens: int, e: int = 128, h: int = 2048, i: int = 768, top_k: int = 8):
  """Qwen3-30B-A3B's MoE layer: x, expert_ids, routing weights, gate, up, down."""
  return (
    jax.ShapeDtypeStruct((num_tokens, h), jnp.bfloat16),
    jax.ShapeDtypeStruct((num_tokens, top_k), jnp.int32),
    jax.ShapeDtypeStruct((num_tokens, top_k), jnp.float32),
    jax.ShapeDtypeStruct((e, h, i), jnp.bfloat16),
    jax.ShapeDtypeStruct((e, h, i), jnp.bfloat16),
    jax.ShapeDtypeStruct((e, i, h), jnp.bfloat16),
  )


def _fp8_moe_args(num_tokens: int, blocks: bool, e: int = 128, h: int = 2048, i: int = 768):
  """_moe_args with fp8 experts (models/fp8_experts.Fp8Weights: [E, out, in] e4m3 and scales)."""

  def fp8(out: int, inner: int) -> Fp8Weights:
    scale = (e, out // 128, inner // 128) if blocks else (e, out)
    return Fp8Weights(
      jax.ShapeDtypeStruct((e, out, inner), jnp.float8_e4m3fn),
      jax.ShapeDtypeStruct(scale, jnp.float32),
    )

  return _moe_args(num_tokens, e, h, i)[:3] + (fp8(i, h), fp8(i, h), fp8(h, i))


@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "block"])
@pytest.mark.parametrize("num_tokens", [1, 8192], ids=["decode1", "prefill8k"])
def test_fp8_moe_layer_lowers_to_the_fp8_grouped_matmul_kernel(num_tokens, blocks):
  """Qwen3-30B-A3B's MoE layer with fp8 experts (per channel, or 128 x 128 blocks): for CUDA,
  the routing and two Pallas fp8 grouped-matmul calls (gate/up fused, down), no ragged_dot, no
  sort, no [M, E, N]."""
  text = _lower_for_cuda(expert_ffn, *_fp8_moe_args(num_tokens, blocks))
  _assert_grouped_matmul_kernels(text, num_tokens * 8, 128, "grouped_matmul_fp8")


def _assert_grouped_matmul_kernels(text: str, m: int, e: int, name: str = "grouped_matmul") -> None:
  """The two grouped matmuls (`name`, bfloat16 or fp8 experts) and the routing before them (one
  program up to 1024 assignments, a count kernel and a placement kernel past them)."""
  routing_calls = 1 if m <= 1024 else 2
  assert _custom_call_targets(text) == {TRITON_CALL_TARGET}
  assert text.count(f"custom_call @{TRITON_CALL_TARGET}") == 2 + routing_calls
  assert text.count('name = "moe_routing"') == min(routing_calls, 1)
  assert text.count('name = "moe_routing_counts"') == max(routing_calls - 1, 0)
  assert text.count(f'name = "{name}"') == 2
  assert "ragged_dot" not in text
  assert not re.search(r"stablehlo\.(sort|scatter|gather)", text)
  assert not re.search(rf"tensor<{m}x{e}x\d+x", text)  # no [M, E, N] array anywhere


def _xla_ops(text: str) -> collections.Counter:
  """The StableHLO ops of a lowered module by name (constants and shape plumbing included)."""
  return collections.Counter(re.findall(r"(?:stablehlo|chlo)\.([a-z_]+)", text))


@pytest.mark.parametrize("quantization", ["none", "fp8"])
@pytest.mark.parametrize("num_tokens", [1, 256])
def test_a_qwen3_moe_layer_is_four_pallas_calls_and_no_sort(num_tokens, quantization):
  """A whole Qwen3-MoE layer (models/layers/moe.SparseMoeBlock: router GEMM, route, experts; E 64,
  top 8, H 256, I 128; bfloat16 or fp8 experts) lowered for CUDA: per layer one cuBLAS-able dot
  (the router's GEMM) and four Pallas calls (router softmax/top-k, routing, gate/up, down; five
  past 128 tokens, where the routing's counts are a kernel of their own), no sort, top-k,
  scatter or gather; what XLA has left is the sum over each token's K assignments and the casts
  (and, fp8, the quantization of the tokens and of the hidden rows)."""
  config = tiny_random_config().replace(
    architecture="qwen3_moe",
    num_experts=64,
    num_experts_per_tok=8,
    moe_intermediate_size=128,
    norm_topk_prob=True,
    dtype="bfloat16",
    quantization=quantization,
  )
  block = SparseMoeBlock(config)
  x = jax.ShapeDtypeStruct((num_tokens, config.hidden_size), jnp.bfloat16)
  params = jax.eval_shape(block.init, jax.random.PRNGKey(0), x)
  text = _lower_for_cuda(block.apply, params, x)
  names = sorted(re.findall(r'name = "(\w+)"', text))
  counts = ["moe_routing_counts"] if num_tokens > 128 else []
  gmm = "grouped_matmul_fp8" if quantization == "fp8" else "grouped_matmul"
  assert names == sorted([gmm, gmm, "moe_router", "moe_routing", *counts])
  assert _custom_call_targets(text) == {TRITON_CALL_TARGET}
  ops = _xla_ops(text)
  assert ops["dot_general"] == 1 and ops["custom_call"] == len(names)
  assert not {"sort", "top_k", "scatter", "gather", "dynamic_slice"} & set(ops)
  assert ops["reduce"] == (1 if quantization == "none" else 3)  # the sum over k, two amaxes


@pytest.mark.parametrize("expert_parallel", [True, False], ids=["ep2", "tp2"])
def test_sharded_moe_layer_lowers_to_the_grouped_matmul_kernel(expert_parallel):
  """parallel/sharded_experts.py over 2 abstract H100s (no devices needed): each device's
  expert_ffn in the shard_map runs the kernel on its experts (64 whole ones, or all 128 cut to
  I / 2 = 384)."""
  device_cls = getattr(jax.sharding, "AbstractDevice", None)
  if device_cls is None or not hasattr(jax.sharding, "use_abstract_mesh"):
    pytest.skip("this JAX has no abstract devices")
  device = device_cls(device_kind="NVIDIA H100", num_cores=132, platform="gpu")
  mesh = jax.sharding.AbstractMesh((2,), (MODEL_AXIS,), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    lowered = jax.jit(shard_experts(mesh, expert_parallel)).trace(*_moe_args(64))
    text = lowered.lower(lowering_platforms=("cuda",)).as_text()
  _assert_grouped_matmul_kernels(text, 64 * 8, 64 if expert_parallel else 128)
  with jax.sharding.use_abstract_mesh(mesh):  # fp8 block experts: scales sharded with them
    lowered = jax.jit(shard_experts(mesh, expert_parallel)).trace(*_fp8_moe_args(64, True))
    text = lowered.lower(lowering_platforms=("cuda",)).as_text()
  _assert_grouped_matmul_kernels(text, 64 * 8, 64 if expert_parallel else 128, "grouped_matmul_fp8")
  local = "64x768x2048" if expert_parallel else "128x384x2048"  # each device's gate [E, I, H]
  assert f"tensor<{local}xf8E4M3FN>" in text
