"""Where the arrays live at tp = 8: every weight's PartitionSpec and shard shapes, KV pages split
by kv head across all 8 devices, and the donated pages updated in place with their sharding."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.api.sampling_params import SamplingParams
from tests.integration.engine_helpers import run_to_completion

TP = 8
# Flax kernels are [in, out]. llama_kv8: H=128, 16 q heads and 8 kv heads of D=64, I=256, V=512.
H, Q_DIM, KV_DIM, INTER, VOCAB, D = 128, 1024, 512, 256, 512, 64
EXPECTED = {
  ("embed_tokens", "embedding"): (P("model", None), (VOCAB // TP, H)),
  ("self_attn", "q_proj", "kernel"): (P(None, "model"), (H, Q_DIM // TP)),
  ("self_attn", "k_proj", "kernel"): (P(None, "model"), (H, KV_DIM // TP)),
  ("self_attn", "v_proj", "kernel"): (P(None, "model"), (H, KV_DIM // TP)),
  ("self_attn", "o_proj", "kernel"): (P("model", None), (Q_DIM // TP, H)),
  ("mlp", "gate_proj", "kernel"): (P(None, "model"), (H, INTER // TP)),
  ("mlp", "up_proj", "kernel"): (P(None, "model"), (H, INTER // TP)),
  ("mlp", "down_proj", "kernel"): (P("model", None), (INTER // TP, H)),
  ("input_layernorm", "scale"): (P(), (H,)),
  ("post_attention_layernorm", "scale"): (P(), (H,)),
  ("norm", "scale"): (P(), (H,)),
  ("lm_head", "kernel"): (P(None, "model"), (H, VOCAB // TP)),
}


def _expected(path: tuple[str, ...]):
  key = path[1:] if path[0].startswith("layers_") else path
  return EXPECTED[key]


@pytest.fixture(scope="module")
def engine(hf_checkpoint, engine_for):
  return engine_for(hf_checkpoint("llama_kv8"), TP)


def test_every_weight_is_split_by_its_rule(engine):
  leaves = jax.tree_util.tree_leaves_with_path(engine.runner.params)
  assert len(leaves) == 3 + 2 * 9
  for key_path, array in leaves:
    path = tuple(k.key for k in key_path)
    spec, shard_shape = _expected(path)
    assert isinstance(array.sharding, NamedSharding), path
    assert array.sharding.spec == spec, path
    shards = array.addressable_shards
    assert len({s.device for s in shards}) == TP, path
    assert all(s.data.shape == shard_shape for s in shards), path


def test_kv_pages_are_split_by_kv_head_and_updated_in_place(engine):
  def pointers(pages):
    return [
      [s.data.unsafe_buffer_pointer() for s in x.addressable_shards]
      for x in jax.tree_util.tree_leaves(pages)
    ]

  num_pages = engine.allocator.num_usable_pages + 1
  ((k_pool, v_pool),) = engine.runner.kv_pages  # a small pool: one group of every layer's slot
  num_slots = k_pool.shape[0]
  for pool in (k_pool, v_pool):
    assert pool.shape == (num_slots, 8, num_pages, 16, D)
    assert pool.sharding.spec == P(None, "model", None, None, None)
    assert sorted(s.index[1].start for s in pool.addressable_shards) == list(range(TP))
    assert all(s.data.shape == (num_slots, 1, num_pages, 16, D) for s in pool.addressable_shards)
  before_sharding = [x.sharding for x in jax.tree_util.tree_leaves(engine.runner.kv_pages)]
  engine.add_request(list(range(5, 40)), SamplingParams(temperature=0.0, max_tokens=4))
  run_to_completion(engine)  # compiles the programs it needs (the test engines warm up lazily)
  before = pointers(engine.runner.kv_pages)
  compilations = engine.stats().num_compilations
  engine.add_request(list(range(5, 40)), SamplingParams(temperature=0.0, max_tokens=4))
  run_to_completion(engine)
  assert [x.sharding for x in jax.tree_util.tree_leaves(engine.runner.kv_pages)] == before_sharding
  assert pointers(engine.runner.kv_pages) == before  # donated and written in place
  assert engine.stats().num_compilations == compilations
