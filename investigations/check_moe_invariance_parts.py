"""On 2 devices: which part of a Qwen3-MoE layer at real widths is not bitwise the same on one
device and on two under tp_invariant_reductions (investigations/moe_invariance_bisect.sh found
the whole engine is not, while a dense Llama is). Random bfloat16 inputs; prints one line per
part: the experts (models/invariant_experts.py through parallel/sharded_experts.py, split by
intermediate column and by expert) at T tokens, and the q/k RMSNorm over head_dim with the
heads whole or split over the devices, XLA's reduction and the fixed-order one.

    python -m investigations.check_moe_invariance_parts [--tokens 128,4096]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.models.layers.moe import route
from jaxserve.models.layers.norms import normalized
from jaxserve.parallel.partition_rules import EXPERT_SPECS, MODEL_AXIS, build_mesh
from jaxserve.parallel.sharded_experts import shard_experts

E, K, H, FFN, HEADS, D = 128, 8, 2048, 768, 32, 128  # Qwen3-30B-A3B


def _same(a: jax.Array, b: jax.Array) -> str:
  a, b = np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32))
  diff = int(np.sum(a.view(np.int32) != b.view(np.int32)))
  return "bitwise" if diff == 0 else f"{diff} of {a.size} differ (max {np.abs(a - b).max():.3g})"


def experts(tokens: int, meshes, key) -> list[str]:
  k = jax.random.split(key, 5)
  x = jax.random.normal(k[0], (tokens, H), jnp.bfloat16)
  weights, ids = route(jax.random.normal(k[1], (tokens, E), jnp.float32), K, True)
  gate = (jax.random.normal(k[2], (E, H, FFN), jnp.float32) * 0.02).astype(jnp.bfloat16)
  up = (jax.random.normal(k[3], (E, H, FFN), jnp.float32) * 0.02).astype(jnp.bfloat16)
  down = (jax.random.normal(k[4], (E, FFN, H), jnp.float32) * 0.02).astype(jnp.bfloat16)
  lines = []
  for ep in (False, True):
    specs, outs = EXPERT_SPECS[ep], []
    for mesh in meshes:
      put = lambda a, spec, mesh=mesh: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
      args = (put(x, P()), put(ids, P()), put(weights, P()))
      args += (put(gate, specs.gate_up), put(up, specs.gate_up), put(down, specs.down))
      outs.append(jax.jit(shard_experts(mesh, ep, 2))(*args))
    lines.append(f"experts {'by expert' if ep else 'by column'}, {tokens} tokens: {_same(*outs)}")
  return lines


def qk_norm(tokens: int, meshes, key) -> list[str]:
  q = jax.random.normal(key, (tokens, HEADS, D), jnp.bfloat16)
  lines = []
  for fixed in (False, True):
    outs = []
    for mesh in meshes:
      spec = P(None, MODEL_AXIS, None) if mesh.shape[MODEL_AXIS] > 1 else P()
      qs = jax.device_put(q, NamedSharding(mesh, spec))
      outs.append(jax.jit(lambda a, fixed=fixed: normalized(a, 1e-6, fixed).astype(a.dtype))(qs))
    lines.append(f"q norm ({'fixed order' if fixed else 'XLA'}), {tokens} tokens: {_same(*outs)}")
  return lines


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", default="128,4096")
  args = parser.parse_args()
  meshes = (build_mesh(1), build_mesh(2))
  key = jax.random.PRNGKey(0)
  for tokens in map(int, args.tokens.split(",")):
    for line in experts(tokens, meshes, key) + qk_norm(tokens, meshes, key):
      print(line, flush=True)


if __name__ == "__main__":
  main()
