"""LayerKV over a pool of several groups of slots (models/kv_layout.py): slot j is index j % c of
group j // c, c read from the pool's shapes; a layer gets its group's pair and its index, and its
update replaces that group alone. A step of the tiny model over 1, 2 and 4 groups computes the
same hidden states and leaves the same pages, slot for slot: every layer read and wrote its own
slot of its own group and nothing else."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.attention import get_attention_backend
from jaxserve.models import LlamaForCausalLM
from jaxserve.models.kv_layout import LayerKV
from jaxserve.models.tiny_random import tiny_random_config, tiny_random_params
from tests.models.gemma_shapes import gemma3
from tests.models.paged_batch import Chunk, build_step

PAGE_SIZE, NUM_PAGES, NUM_TOKENS, PAGES_PER_SEQ = 4, 5, 8, 4


def _pool(num_slots: int, slots_per_group: int, shape=(1, 1, 1, 1)):
  """Groups whose every slot j holds the value j in K and -j in V."""
  return tuple(
    tuple(
      sign
      * jnp.broadcast_to(
        jnp.arange(g * slots_per_group, (g + 1) * slots_per_group, dtype=jnp.float32).reshape(
          -1, 1, 1, 1, 1
        ),
        (slots_per_group, *shape),
      )
      for sign in (1, -1)
    )
    for g in range(num_slots // slots_per_group)
  )


def _metadata_args(num_kv_groups: int):
  arrays = build_step(
    [Chunk([1, 2], 0, [1])],
    page_size=PAGE_SIZE,
    num_tokens=NUM_TOKENS,
    num_seq_slots=1,
    pages_per_seq=PAGES_PER_SEQ,
    num_groups=num_kv_groups,
  )
  return arrays.slot_mapping, arrays.metadata


def test_a_layer_gets_its_groups_pair_and_its_index_and_updates_that_group_alone():
  config = tiny_random_config().replace(num_layers=4)
  pool = _pool(4, 2)
  kv = LayerKV(config, pool, *_metadata_args(1))
  for layer in range(4):
    k_pool, v_pool, kv_slot, _, _ = kv.layer(layer)
    assert kv.pool_place(layer) == (layer // 2, layer % 2)
    assert k_pool is pool[layer // 2][0] and v_pool is pool[layer // 2][1]
    assert kv_slot.dtype == jnp.int32 and kv_slot.tolist() == [layer % 2]
    assert float(k_pool[kv_slot[0]].sum()) == layer
  new_k, new_v = jnp.full_like(pool[1][0], 7.0), jnp.full_like(pool[1][1], 8.0)
  kv.update(3, new_k, new_v)
  pages = kv.pages()
  assert pages[0] == pool[0]  # the other group: the very arrays it had
  assert pages[1] == (new_k, new_v)
  assert kv.layer(2)[0] is new_k  # layer 2 shares group 1: it reads what layer 3 wrote


def test_gemma_layers_find_their_slot_in_groups_of_slots():
  # Gemma 3 12B: 8 slots (the global layers'), 6 KV groups; layer 11 is global (KV group 0,
  # slot 1), layer 10 sliding (KV group 2, slot 1), layer 47 global (slot 7).
  config = gemma3(48)
  kv = LayerKV(config, _pool(8, 2), *_metadata_args(6))
  assert kv.pool_place(11) == (0, 1) == kv.pool_place(10)
  assert kv.pool_place(47) == (3, 1)
  assert kv.layer(10)[3].shape == kv.layer(11)[3].shape  # its own KV group's slot mapping [T]


@pytest.mark.parametrize(
  "pool",
  [
    _pool(4, 4) + _pool(4, 4),  # 8 slots for 4 layers
    _pool(2, 1) + _pool(2, 2),  # unequal groups
    ((jnp.zeros((4, 1, 1, 1)),) * 2,),  # not 5-D
  ],
)
def test_pools_that_do_not_hold_the_layers_slots_are_refused(pool):
  config = tiny_random_config().replace(num_layers=4)
  with pytest.raises(ValueError, match="kv_pages: expected equal"):
    LayerKV(config, pool, *_metadata_args(1))


def test_a_step_over_any_grouping_of_the_slots_computes_the_same():
  config = tiny_random_config().replace(num_layers=4)
  model = LlamaForCausalLM(config, get_attention_backend("reference"))
  params = tiny_random_params(config)
  arrays = build_step(
    [Chunk([3, 1, 4, 1, 5], 0, [1, 2]), Chunk([9, 2], 0, [3])],
    page_size=PAGE_SIZE,
    num_tokens=NUM_TOKENS,
    num_seq_slots=2,
    pages_per_seq=PAGES_PER_SEQ,
  )

  @jax.jit
  def step(kv):
    return model.apply(
      {"params": params},
      arrays.token_ids,
      arrays.positions,
      kv,
      arrays.slot_mapping,
      arrays.metadata,
    )

  shape = (config.num_kv_heads, NUM_PAGES, PAGE_SIZE, config.head_dim)
  results = {}
  for per_group in (4, 2, 1):
    zeros = jnp.zeros((per_group, *shape), jnp.float32)
    hidden, kv = step(tuple((zeros, zeros) for _ in range(4 // per_group)))
    assert len(kv) == 4 // per_group and all(k.shape == (per_group, *shape) for k, _ in kv)
    k_all = np.concatenate([np.asarray(k) for k, _ in kv])  # [4, KV, pages, page_size, D]
    v_all = np.concatenate([np.asarray(v) for _, v in kv])
    results[per_group] = (np.asarray(hidden), k_all, v_all)
  hidden, k_all, v_all = results[4]
  # Every layer wrote its own slot: pages 1-3 hold 7 tokens a slot, each slot's differ.
  assert all(np.abs(k_all[j, :, 1:4]).sum() > 0 for j in range(4))
  assert all(not np.array_equal(k_all[i], k_all[j]) for i in range(4) for j in range(i))
  assert not np.abs(k_all[:, :, 4]).any()  # page 4: nobody's
  for per_group in (2, 1):
    np.testing.assert_array_equal(results[per_group][0], hidden)
    np.testing.assert_array_equal(results[per_group][1], k_all)
    np.testing.assert_array_equal(results[per_group][2], v_all)
