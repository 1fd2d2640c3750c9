"""The KV pool crosses a step program as two donated arrays a group of slots and every layer updates
its group in place: the optimized HLO of the compiled forward and burst programs (tiny Llama, every
layer one slot of the pool) holds exactly 2 x num_groups parameters of the group's shape, aliases
all of them to outputs, and copies the pool nowhere (a copy would be a whole-group move per step or
per layer). Pools of one group and of two groups of two slots (device/kv_cache.group_pool with a
small array limit standing in for 2**31 elements)."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from jaxserve.attention import get_attention_backend
from jaxserve.device.kv_cache import MAX_ARRAY_ELEMENTS, KVCacheSpec, group_pool, kv_pool_shapes
from jaxserve.device.lowering import abstract
from jaxserve.device.model_runner import packed_model_inputs
from jaxserve.device.packing import pack
from jaxserve.device.sampler import SamplerMode
from jaxserve.device.step_inputs import PreviousSamples, StepShape, build_step_inputs
from jaxserve.device.step_programs import build_step_programs
from jaxserve.messages.buckets import Bucket
from jaxserve.messages.scheduled_batch import ScheduledBatch
from jaxserve.models.families.llama import LlamaForCausalLM
from jaxserve.models.tiny_random import tiny_random_config
from jaxserve.models.weights import param_shapes

PAGE_SIZE, NUM_PAGES, BUCKET = 4, 8, Bucket(4, 16)


def _optimized_hlo(
  backend_name: str, num_layers: int, max_elements: int
) -> tuple[str, str, str, int]:
  """(forward's, burst's) optimized HLO text, a group's HLO shape string and the group count."""
  config = tiny_random_config().replace(num_layers=num_layers)
  slot_page = config.num_kv_heads * PAGE_SIZE * config.head_dim
  groups = group_pool(num_layers, slot_page, 4, NUM_PAGES, False, max_elements=max_elements)
  assert groups.num_pages == NUM_PAGES
  spec = KVCacheSpec(
    num_layers,
    config.num_kv_heads,
    config.head_dim,
    PAGE_SIZE,
    NUM_PAGES,
    config.dtype,
    groups.slots_per_group,
  )
  model = LlamaForCausalLM(config, get_attention_backend(backend_name))
  programs = build_step_programs(model, burst_steps=2, page_size=PAGE_SIZE)
  pool = kv_pool_shapes(spec)
  shape = StepShape(PAGE_SIZE, NUM_PAGES, PAGE_SIZE * NUM_PAGES, config.vocab_size)
  previous = PreviousSamples(np.zeros(BUCKET.num_seqs, np.int32), {})
  inputs = build_step_inputs(ScheduledBatch(), BUCKET, shape, previous)
  params, packed = param_shapes(config), abstract(packed_model_inputs(inputs))
  forward = programs.forward.lower(params, pool, packed).compile().as_text()
  sampling = abstract(pack(inputs.sampling))
  burst = programs.burst.lower(params, pool, packed, sampling, SamplerMode())
  return forward, burst.compile().as_text(), _hlo_shape(pool[0][0]), spec.num_groups


def _hlo_shape(pool: jax.ShapeDtypeStruct) -> str:
  dtype = {"float32": "f32", "bfloat16": "bf16"}[pool.dtype.name]
  return f"{dtype}[{','.join(map(str, pool.shape))}]"


def _entry(text: str) -> str:
  return text[text.index("\nENTRY ") :]


@pytest.mark.parametrize("backend_name", ["xla", "reference"])
@pytest.mark.parametrize(
  "num_layers,max_elements,num_groups",
  [(2, MAX_ARRAY_ELEMENTS, 1), (4, 2 * 2 * PAGE_SIZE * 64 * NUM_PAGES, 2)],
)
def test_the_pool_is_two_donated_arrays_a_group_never_copied(
  backend_name, num_layers, max_elements, num_groups
):
  forward, burst, group_shape, groups = _optimized_hlo(backend_name, num_layers, max_elements)
  assert groups == num_groups
  for text in (forward, burst):
    entry = _entry(text)
    params = re.findall(rf"= {re.escape(group_shape)}\{{[\d,]+\}} parameter\((\d+)\)", entry)
    assert len(params) == 2 * num_groups, params  # k_pool and v_pool a group
    aliases = text.splitlines()[0]  # the HloModule line: input_output_alias={ ... }
    for index in params:
      assert f"({index}, {{}}, may-alias)" in aliases, (index, aliases)
    copies = [line for line in text.splitlines() if f"{group_shape}" in line and " copy(" in line]
    assert not copies, copies
