"""Quantized weights under tensor parallelism: the sharded load holds the one-device load's very
8-bit kernels and scales, each split as the partition rules say (quantize-on-load and a
compressed-tensors checkpoint alike), and a sharded quantized engine gives the one-device
quantized engine's greedy tokens and, within a stated tolerance, its prompt logprobs.

Sources: a float safetensors checkpoint quantized as it loads, a compressed-tensors one loaded as
stored, a float checkpoint's Orbax copy and the built-in model, both quantized after loading.
The one-device engine is the reference: it runs the same scheme on the same checkpoint (merged
q/k/v and gate/up, unsharded GEMMs), so what differs is only where the math runs: the row-split
o/down projections sum float32 partials across devices, in another order than one device does.
"""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxserve.models.fp8_experts import Fp8Weights
from jaxserve.models.grouped_matmul import expert_ffn
from jaxserve.models.registry import convert_checkpoint, load_model
from jaxserve.parallel.partition_rules import build_mesh
from jaxserve.parallel.sharded_experts import shard_experts
from jaxserve.parallel.sharded_loading import load_model_sharded
from tests.integration.engine_helpers import generate_and_score
from tests.models.block_fp8_checkpoints import write_block_fp8
from tests.models.compressed_checkpoints import write_compressed_tensors
from tests.models.hf_checkpoints import build_hf_checkpoint
from tests.parallel.mesh.conftest import tp_engine

FAMILY = "llama_kv8"  # 8 kv heads
NUM_NEW_TOKENS = 12
PROMPTS = [[5 + (11 * i + 7 * j) % 390 for j in range(n)] for i, n in enumerate((3, 17, 41))]
# float32 activations: the split o/down reductions moved a prompt logprob by at most 3e-6 (int8
# and fp8 at tp 2 and 4, measured); the bound is tp_parity's for float weights.
LOGPROB_ATOL = 1e-4
EIGHT_BITS = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}


def _leaves(params: dict) -> dict[tuple[str, ...], jax.Array]:
  return {
    tuple(str(k.key) for k in path): leaf
    for path, leaf in jax.tree_util.tree_leaves_with_path(params)
  }


def _source(kind: str, scheme: str, hf_checkpoint, tmp_path) -> str:
  """safetensors (quantized on load), compressed-tensors (stored), a float checkpoint's orbax
  copy (quantized after restoring) or the built-in model (quantized after generating)."""
  checkpoint = hf_checkpoint(FAMILY)
  if kind == "stored":
    return str(write_compressed_tensors(checkpoint, tmp_path / "ct", scheme))
  if kind == "orbax":
    shutil.copytree(checkpoint, tmp_path / "orbax")
    convert_checkpoint(tmp_path / "orbax")
    return str(tmp_path / "orbax")
  return "tiny-random" if kind == "builtin" else str(checkpoint)


@pytest.mark.parametrize(
  "scheme, kind, tp",
  [
    ("int8", "safetensors", 2),
    ("fp8", "safetensors", 4),
    ("fp8", "stored", 2),
    ("int8", "orbax", 4),
    ("int8_w8a8", "builtin", 2),
  ],
)
def test_a_sharded_quantized_load_holds_the_one_device_params(
  hf_checkpoint, tmp_path, scheme, kind, tp
):
  model = _source(kind, scheme, hf_checkpoint, tmp_path)
  one = _leaves(load_model(model, quantization=scheme).params)
  sharded = load_model_sharded(model, "auto", build_mesh(tp), quantization=scheme)
  assert sharded.config.quantization == scheme
  leaves = _leaves(sharded.params)
  assert leaves.keys() == one.keys()
  for path, leaf in leaves.items():
    assert leaf.dtype == one[path].dtype, path
    np.testing.assert_array_equal(
      np.asarray(leaf).view(np.uint8), np.asarray(one[path]).view(np.uint8), err_msg=str(path)
    )
  specs = {path[1:]: leaf.sharding.spec for path, leaf in leaves.items() if path[0] == "layers_0"}
  assert specs[("self_attn", "q_proj", "kernel")] == P("model", None)
  assert specs[("self_attn", "v_proj", "scale")] == P("model")
  assert specs[("self_attn", "o_proj", "kernel")] == P(None, "model")
  assert specs[("self_attn", "o_proj", "scale")] == P()
  assert specs[("mlp", "up_proj", "scale")] == P("model")
  assert specs[("mlp", "down_proj", "kernel")] == P(None, "model")
  kernel = leaves[("layers_0", "mlp", "gate_proj", "kernel")]
  intermediate, hidden = kernel.shape
  assert kernel.addressable_shards[0].data.shape == (intermediate // tp, hidden)


@pytest.mark.parametrize("scheme, tp", [("int8", 2), ("fp8", 4)])
def test_a_sharded_quantized_engine_gives_the_one_device_tokens(hf_checkpoint, scheme, tp):
  checkpoint = hf_checkpoint(FAMILY)
  one_tokens, one_logprobs = generate_and_score(
    tp_engine(checkpoint, 1, quantization=scheme), PROMPTS, NUM_NEW_TOKENS
  )
  sharded = tp_engine(checkpoint, tp, quantization=scheme)
  kernel = sharded.runner.params["layers_0"]["mlp"]["down_proj"]["kernel"]
  assert kernel.dtype == EIGHT_BITS[scheme] and kernel.sharding.spec == P(None, "model")
  tokens, logprobs = generate_and_score(sharded, PROMPTS, NUM_NEW_TOKENS)
  assert tokens == one_tokens
  for ours, reference in zip(logprobs, one_logprobs, strict=True):
    np.testing.assert_allclose(ours, reference, atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.parametrize(
  "family, source, scheme, tp, expert_parallel",
  [
    ("qwen3_moe", "block_fp8", "none", 2, False),
    ("qwen3_moe", "block_fp8", "none", 2, True),
    ("llama_kv8", "block_fp8", "fp8", 4, False),
    ("qwen3_moe", "float", "fp8", 2, True),
  ],
)
def test_dequantized_and_moe_loads_shard_the_one_device_params(
  hf_checkpoint, tmp_path, family, source, scheme, tp, expert_parallel
):
  """A block-wise fp8 checkpoint dequantized as it loads (as floats, or re-quantized), and a
  MoE quantized on load (its attention): each sharded leaf is the one-device load's."""
  checkpoint = hf_checkpoint(family)
  if source == "block_fp8":
    checkpoint = write_block_fp8(checkpoint, tmp_path / "fp8")
  one = _leaves(load_model(str(checkpoint), quantization=scheme).params)
  sharded = load_model_sharded(
    str(checkpoint), "auto", build_mesh(tp), quantization=scheme, expert_parallel=expert_parallel
  )
  leaves = _leaves(sharded.params)
  assert leaves.keys() == one.keys()
  for path, leaf in leaves.items():
    assert leaf.dtype == one[path].dtype, path
    np.testing.assert_array_equal(
      np.asarray(leaf).view(np.uint8), np.asarray(one[path]).view(np.uint8), err_msg=str(path)
    )


@pytest.mark.parametrize(
  "blocks, expert_parallel",
  [(True, False), (True, True), (False, False)],
  ids=["block-tp2", "block-ep2", "channel-tp2"],
)
def test_fp8_experts_shard_with_their_scales(tmp_path, blocks, expert_parallel):
  """fp8 experts (a block-wise fp8 Qwen3-MoE with I = 256: two blocks of 128; or per channel
  from `--quantization fp8`): the sharded load holds the one-device load's bytes, each weight
  [E, out, in] and its scale split together (partition_rules.FP8_EXPERT_SPECS), and the sharded
  experts (parallel/sharded_experts.py) compute the one-device layer: to float32 rounding where
  every device sees whole activation rows (expert parallel, and 128-column blocks), within the
  per-device activation scales' rounding otherwise (tensor parallel per channel: the down
  projection's rows are quantized over each device's I / 2 columns)."""
  source = build_hf_checkpoint(
    "qwen3_moe", tmp_path / "float", overrides={"moe_intermediate_size": 256}
  )
  model = str(write_block_fp8(source, tmp_path / "fp8") if blocks else source)
  scheme = "none" if blocks else "fp8"
  one = load_model(model, quantization=scheme)
  assert one.config.expert_quantization == ("fp8_block" if blocks else "fp8_channel")
  mesh = build_mesh(2)
  sharded = load_model_sharded(
    model, "auto", mesh, quantization=scheme, expert_parallel=expert_parallel
  )
  ones, leaves = _leaves(one.params), _leaves(sharded.params)
  assert leaves.keys() == ones.keys()
  for path, leaf in leaves.items():
    np.testing.assert_array_equal(
      np.asarray(leaf).view(np.uint8), np.asarray(ones[path]).view(np.uint8), err_msg=str(path)
    )
  experts = sharded.params["layers_0"]["mlp"]["experts"]
  for name, split in (("gate_proj", 1), ("down_proj", 2)):  # tensor parallel: I's axis
    axis = 0 if expert_parallel else split
    for leaf in (experts[name], experts[name + "_scale"]):
      want = list(leaf.shape)
      if axis < leaf.ndim:  # a per-channel down_proj scale [E, H] is replicated
        want[axis] //= 2
      assert leaf.addressable_shards[0].data.shape == tuple(want), (name, leaf.shape)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((8, 128)), jnp.float32)
  ids = jnp.asarray(np.argsort(rng.random((8, 8)), axis=1)[:, :4], jnp.int32)
  routing = jnp.full((8, 4), 0.25, jnp.float32)

  def weights(tree):
    return [Fp8Weights(tree[p], tree[p + "_scale"]) for p in ("gate_proj", "up_proj", "down_proj")]

  want = np.asarray(expert_ffn(x, ids, routing, *weights(one.params["layers_0"]["mlp"]["experts"])))
  got = np.asarray(
    jax.jit(shard_experts(mesh, expert_parallel))(x, ids, routing, *weights(experts))
  )
  exact = blocks or expert_parallel
  np.testing.assert_allclose(got, want, rtol=0, atol=(1e-5 if exact else 0.05) * np.abs(want).max())
