"""The device mesh of a sharded engine and the partition rules that lay every param and the KV
pages out over it. This is the one module that knows the sharding; the model code has none.

The mesh has one axis, `model`, over tensor_parallel_size devices (with several hosts, all
devices of all processes, so tensor_parallel_size must equal jax.device_count()). Attention and
the dense weights are tensor-parallel over it; a mixture of experts' stacked experts are split
over the same devices either by their intermediate dimension (tensor parallel, the default) or,
with `expert_parallel` (`--enable-expert-parallel`, vLLM's layout: EP size = TP size), by expert,
each device holding num_experts / tp whole experts. Attention, the dense weights and the KV pages
are laid out the same either way.

Rules match a param's path (joined with "/") and give a PartitionSpec for its array (flax
kernels are [in, out]):

  q/k/v_proj kernel [H, heads*D], bias [heads*D]  column-sharded: each device owns whole heads
  o_proj kernel [Q*D, H]                          row-sharded (XLA inserts the all-reduce)
  gate/up_proj kernel [H, I]                      column-sharded
  down_proj kernel [I, H]                         row-sharded (all-reduce after it)
  embed_tokens/embedding [V, H]                   vocab-sharded: the lookup is a masked local
  lm_head kernel [H, V]                           gather plus an all-reduce; logits come out
                                                  vocab-sharded and the sampler's reductions
                                                  over the vocabulary gather them
  norms, q_norm/k_norm scales                     replicated (tiny)

A mixture of experts' MLP (models/layers/moe.py): the router is replicated, the stacked experts
follow EXPERT_SPECS for the layout:

                                        tensor parallel        expert parallel
  mlp/gate/kernel [H, E]                replicated             replicated
  mlp/experts/gate_proj, up_proj        (-, -, model)          (model, -, -)
    [E, H, I]
  mlp/experts/down_proj [E, I, H]       (-, model, -)          (model, -, -)

The dense MLP layers of a mixture of experts (ModelConfig.dense_mlp_layers) hold gate/up/down_proj
kernels under `mlp`, laid out by the dense rules above whichever the experts' layout.
Either way every device holds every token (attention's output is all-reduced) and runs its
slice of the experts over them; parallel/sharded_experts.py sums the float32 partials with one
all-reduce, as vLLM's MoE layer does after its experts without data parallelism.

A quantized projection (models/quantized_dense.py) stores its kernel [out, in], the transpose of
a float one, beside a float32 `scale` [out], one per output channel; what makes a projection
quantized is that context (its module holds a `scale` leaf), never the kernel's shape or dtype.
Its rules shard the same channels as the float ones, on the other axis, and the scales follow
their channels:

  q/k/v_proj, gate/up_proj kernel [out, in]        axis 0 (out); scale [out] and bias sharded
  o_proj, down_proj kernel [out, in]               axis 1 (in); scale [out] replicated (their
                                                   out channels are not split)

fp8 experts (models/fp8_experts.py: the experts module holds `<projection>_scale` leaves) store
each projection [E, out, in], the transpose of the float experts' [E, in, out], so their rules
shard the same dimension on the other axis, and each scale ([E, out] per channel, [E, out/128,
in/128] per block) takes its weight's spec truncated to its rank, so it shards with its
experts (expert parallel), or with its output channels / blocks of I (tensor parallel; a
per-channel down_proj scale [E, H] is replicated):

                                        tensor parallel        expert parallel
  mlp/experts/gate_proj, up_proj        (-, model, -)          (model, -, -)
    [E, I, H], scales [E, I(/128), ...]
  mlp/experts/down_proj [E, H, I],      (-, -, model)          (model, -, -)
    scale [E, H] or [E, H/128, I/128]

Block scales under tensor parallelism need whole 128-blocks of I per device (check_experts).

Merged projections (qkv_proj, gate_up_proj) have no rule: sharded models keep HF's separate
projections (models/fused_projections.py says why).

A dimension the rule shards but the mesh size does not divide (an odd vocabulary, say) is
replicated instead, so every model loads; query heads must divide (check_tensor_parallel), and so
must the experts' sharded dimension (check_experts), since their shard_map needs even shards.
kv heads either divide too, or are fewer than the devices and divide them: then the engine runs
with_replicated_kv_heads, each kv head repeated over the devices of its query heads (vLLM does the
same), so every device still holds one whole kv head and its pages.
With `shard_vocab=False` (models with tp_invariant_reductions) the two vocabulary-sized weights
are replicated: every device computes the whole logits as the unsharded model does, so the
vocabulary reductions after them (log-softmax, argmax) run in the unsharded order, without
collectives, at the price of one more copy of those weights per device.
Every group array of the KV pool [slots_per_group, num_kv_heads, num_pages, page_size, head_dim]
is sharded on the kv-head axis (its second), matching the k/v projections, so a device's attention
reads only its own pages. Step inputs and step
outputs are replicated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.models.model_config import ModelConfig

MODEL_AXIS = "model"
ParamPath = tuple[str, ...]


@dataclass(frozen=True)
class ExpertSpecs:
  """The stacked experts' PartitionSpecs under one layout."""

  gate_up: P  # gate_proj, up_proj [E, H, I]
  down: P  # down_proj [E, I, H]
  by_expert: bool  # whole experts per device (each device's first expert is its index * E/tp)


EXPERT_SPECS = {
  False: ExpertSpecs(P(None, None, MODEL_AXIS), P(None, MODEL_AXIS, None), by_expert=False),
  True: ExpertSpecs(P(MODEL_AXIS, None, None), P(MODEL_AXIS, None, None), by_expert=True),
}  # keyed by expert_parallel
FP8_EXPERT_SPECS = {
  False: ExpertSpecs(P(None, MODEL_AXIS, None), P(None, None, MODEL_AXIS), by_expert=False),
  True: EXPERT_SPECS[True],
}  # fp8 experts [E, out, in], keyed by expert_parallel
EXPERT_SCALE = r"mlp/experts/(gate|up|down)_proj_scale$"

PARAM_RULES: tuple[tuple[str, P], ...] = (
  (r"self_attn/(q|k|v)_proj/kernel$", P(None, MODEL_AXIS)),
  (r"self_attn/(q|k|v)_proj/bias$", P(MODEL_AXIS)),
  (r"self_attn/o_proj/kernel$", P(MODEL_AXIS, None)),
  (r"mlp/(gate|up)_proj/kernel$", P(None, MODEL_AXIS)),
  (r"mlp/down_proj/kernel$", P(MODEL_AXIS, None)),
  (r"^embed_tokens/embedding$", P(MODEL_AXIS, None)),
  (r"^lm_head/kernel$", P(None, MODEL_AXIS)),
  (r"(layernorm|norm)/scale$", P()),
  (r"mlp/gate/kernel$", P()),
)
EXPERT_GATE_UP, EXPERT_DOWN = r"mlp/experts/(gate|up)_proj$", r"mlp/experts/down_proj$"
# A quantized projection's leaves (the projection holds a `scale`): checked before PARAM_RULES.
QUANTIZED_RULES: tuple[tuple[str, P], ...] = (
  (r"self_attn/(q|k|v)_proj/kernel$", P(MODEL_AXIS, None)),
  (r"self_attn/(q|k|v)_proj/(scale|bias)$", P(MODEL_AXIS)),
  (r"self_attn/o_proj/kernel$", P(None, MODEL_AXIS)),
  (r"self_attn/o_proj/(scale|bias)$", P()),
  (r"mlp/(gate|up)_proj/kernel$", P(MODEL_AXIS, None)),
  (r"mlp/(gate|up)_proj/(scale|bias)$", P(MODEL_AXIS)),
  (r"mlp/down_proj/kernel$", P(None, MODEL_AXIS)),
  (r"mlp/down_proj/(scale|bias)$", P()),
)
VOCAB_PARAMS = r"^(embed_tokens/embedding|lm_head/kernel)$"
# Each KV pool group array [slots_per_group, num_kv_heads, num_pages, page_size, head_dim]: split
# by kv head
KV_PAGES_SPEC = P(None, MODEL_AXIS, None, None, None)


def build_mesh(tensor_parallel_size: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A one-axis (MODEL_AXIS) mesh over the first tensor_parallel_size devices."""
  devices = list(devices if devices is not None else jax.devices())
  if tensor_parallel_size > len(devices):
    raise ValueError(
      f"tensor_parallel_size: {tensor_parallel_size} exceeds the {len(devices)} available devices"
    )
  if jax.process_count() > 1 and tensor_parallel_size != len(devices):
    raise ValueError(
      f"tensor_parallel_size: must equal the {len(devices)} devices of all "
      f"{jax.process_count()} processes when serving on several hosts, "
      f"got {tensor_parallel_size}"
    )
  return Mesh(np.array(devices[:tensor_parallel_size]), (MODEL_AXIS,))


def kv_head_replicas(model_config: ModelConfig, tensor_parallel_size: int) -> int:
  """How many devices hold a copy of each kv head: 1 when tensor_parallel_size divides the kv
  heads, else tensor_parallel_size / num_kv_heads (check_tensor_parallel)."""
  return max(1, tensor_parallel_size // model_config.num_kv_heads)


def with_replicated_kv_heads(model_config: ModelConfig, tensor_parallel_size: int) -> ModelConfig:
  """The config the sharded engine runs: with fewer kv heads than devices, each kv head repeated
  kv_head_replicas times (repeated head n is head n // replicas), so every device holds one whole
  kv head, its query heads' (vLLM's replication); the model computes the same attention. The
  loader repeats the k/v projections to match (parallel/sharded_loading.py)."""
  replicas = kv_head_replicas(model_config, tensor_parallel_size)
  return model_config.replace(num_kv_heads=model_config.num_kv_heads * replicas)


def check_tensor_parallel(model_config: ModelConfig, tensor_parallel_size: int) -> None:
  """Attention shards whole query heads per device, and whole kv heads, or one replicated kv head
  per device when tensor_parallel_size is a multiple of the kv heads."""
  tp, kv_heads = tensor_parallel_size, model_config.num_kv_heads
  if kv_heads % tp != 0 and tp % kv_heads != 0:
    raise ValueError(
      f"tensor_parallel_size: {tp} does not divide the model's {kv_heads} kv heads "
      "nor is a multiple of them"
    )
  if model_config.num_q_heads % tp != 0:
    raise ValueError(
      f"tensor_parallel_size: {tp} does not divide the model's "
      f"{model_config.num_q_heads} query heads"
    )


def check_experts(
  model_config: ModelConfig, tensor_parallel_size: int, expert_parallel: bool
) -> None:
  """A mixture of experts' experts split evenly over the devices: whole experts with
  expert_parallel, else their intermediate dimension; expert_parallel refused for a dense model."""
  tp = tensor_parallel_size
  if not model_config.num_experts:
    if expert_parallel:
      raise ValueError(f"enable_expert_parallel: {model_config.architecture} has no experts")
    return
  if expert_parallel and model_config.num_experts % tp != 0:
    raise ValueError(
      f"enable_expert_parallel: {tp} devices do not divide the model's "
      f"{model_config.num_experts} experts"
    )
  if not expert_parallel and model_config.moe_intermediate_size % tp != 0:
    raise ValueError(
      f"tensor_parallel_size: {tp} does not divide the experts' intermediate size "
      f"{model_config.moe_intermediate_size}"
    )
  blocks = model_config.moe_intermediate_size // 128
  if not expert_parallel and model_config.expert_quantization == "fp8_block" and blocks % tp:
    raise ValueError(
      f"tensor_parallel_size: {tp} does not divide the fp8 experts' {blocks} blocks of 128 "
      "intermediate columns (block scales); use enable_expert_parallel"
    )


def param_spec(
  path: ParamPath,
  shape: tuple[int, ...],
  mesh_size: int,
  shard_vocab: bool = True,
  quantized: bool = False,
  expert_parallel: bool = False,
) -> P:
  """The PartitionSpec of the param at `path` over a model axis of `mesh_size` devices, the
  experts split by expert when `expert_parallel`; `quantized`: it belongs to a quantized
  projection (one holding a `scale`: is_quantized_projection) or fp8 experts
  (is_quantized_projection too). ValueError if no rule matches."""
  name = "/".join(path)
  if not shard_vocab and re.search(VOCAB_PARAMS, name):
    return P()
  experts = (FP8_EXPERT_SPECS if quantized else EXPERT_SPECS)[expert_parallel]
  if quantized and re.search(EXPERT_SCALE, name):  # its weight's spec, truncated to its rank
    spec = experts.down if "down_proj" in name else experts.gate_up
    return _divisible(P(*tuple(spec)[: len(shape)]), shape, mesh_size)
  rules = (
    (QUANTIZED_RULES if quantized else ())
    + PARAM_RULES
    + ((EXPERT_GATE_UP, experts.gate_up), (EXPERT_DOWN, experts.down))
  )
  for pattern, spec in rules:
    if re.search(pattern, name):
      return _divisible(spec, shape, mesh_size)
  raise ValueError(f"params: no partition rule matches {name!r} (shape {shape})")


def _divisible(spec: P, shape: tuple[int, ...], mesh_size: int) -> P:
  """`spec` with every sharded axis that mesh_size does not divide dropped."""
  if len(spec) > len(shape):
    raise ValueError(f"partition rule {spec} has more axes than the param shape {shape}")
  return P(*(axis if shape[i] % mesh_size == 0 else None for i, axis in enumerate(spec)))


def is_quantized_projection(leaves: Mapping[str, object], name: str) -> bool:
  """Whether the module `name` holding `leaves` is a quantized projection: a *_proj with a
  `scale` leaf (a float projection has kernel and bias only; norms' scales are not *_proj), or
  fp8 experts (`experts` holding a `gate_proj_scale`)."""
  if name == "experts":
    return "gate_proj_scale" in leaves
  return name.endswith("_proj") and "scale" in leaves


def expert_specs(expert_parallel: bool, fp8: bool) -> ExpertSpecs:
  """The stacked experts' specs (EXPERT_SPECS, or FP8_EXPERT_SPECS for fp8 experts)."""
  return (FP8_EXPERT_SPECS if fp8 else EXPERT_SPECS)[expert_parallel]


def param_shardings(
  abstract_params: dict, mesh: Mesh, shard_vocab: bool = True, expert_parallel: bool = False
) -> dict:
  """A NamedSharding for every leaf of a params tree (arrays or ShapeDtypeStructs); a leaf of a
  quantized projection gets the quantized rules (is_quantized_projection, from its siblings)."""
  size = mesh.shape[MODEL_AXIS]

  def walk(tree: Mapping, path: ParamPath) -> dict:
    out = {}
    for key, value in tree.items():
      if isinstance(value, Mapping):
        out[key] = walk(value, path + (str(key),))
        continue
      quantized = bool(path) and is_quantized_projection(tree, path[-1])
      spec = param_spec(
        path + (str(key),), tuple(value.shape), size, shard_vocab, quantized, expert_parallel
      )
      out[key] = NamedSharding(mesh, spec)
    return out if isinstance(tree, dict) else type(tree)(out)

  return walk(abstract_params, ())


def kv_pages_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, KV_PAGES_SPEC)


def logits_sharding(params: dict, mesh: Mesh) -> NamedSharding:
  """The logits' layout [S, V]: vocab-sharded when the output projection is (lm_head kernel
  [H, V], or the tied embedding [V, H]), else replicated."""
  if "lm_head" in params:
    vocab_axis = params["lm_head"]["kernel"].sharding.spec[1:2]
  else:
    vocab_axis = params["embed_tokens"]["embedding"].sharding.spec[:1]
  axis = vocab_axis[0] if vocab_axis else None
  return NamedSharding(mesh, P(None, axis))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
