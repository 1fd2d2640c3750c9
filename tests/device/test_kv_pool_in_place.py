"""The stacked KV pool crosses a step program as two donated arrays and every layer updates it in
place: the optimized HLO of the compiled forward and burst programs (tiny Llama, every layer one
slot of the pool) holds exactly two parameters of the pool's shape, aliases both to outputs, and
copies the pool nowhere (a copy would be a whole-pool move per step or per layer)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.attention import get_attention_backend
from jaxserve.device.kv_cache import KVCacheSpec
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


def _optimized_hlo(backend_name: str) -> tuple[str, str, str]:
  """(forward's, burst's) optimized HLO text and the pool's HLO shape string."""
  config = tiny_random_config()
  spec = KVCacheSpec(
    config.num_layers, config.num_kv_heads, config.head_dim, PAGE_SIZE, NUM_PAGES, config.dtype
  )
  model = LlamaForCausalLM(config, get_attention_backend(backend_name))
  programs = build_step_programs(model, burst_steps=2, page_size=PAGE_SIZE)
  pool = jax.ShapeDtypeStruct(spec.pool_shape, jnp.dtype(spec.dtype))
  shape = StepShape(PAGE_SIZE, NUM_PAGES, PAGE_SIZE * NUM_PAGES, config.vocab_size)
  previous = PreviousSamples(np.zeros(BUCKET.num_seqs, np.int32), {})
  inputs = build_step_inputs(ScheduledBatch(), BUCKET, shape, previous)
  params, packed = param_shapes(config), abstract(packed_model_inputs(inputs))
  forward = programs.forward.lower(params, (pool, pool), packed).compile().as_text()
  sampling = abstract(pack(inputs.sampling))
  burst = programs.burst.lower(params, (pool, pool), packed, sampling, SamplerMode())
  return forward, burst.compile().as_text(), _hlo_shape(pool)


def _hlo_shape(pool: jax.ShapeDtypeStruct) -> str:
  dtype = {"float32": "f32", "bfloat16": "bf16"}[pool.dtype.name]
  return f"{dtype}[{','.join(map(str, pool.shape))}]"


def _entry(text: str) -> str:
  return text[text.index("\nENTRY ") :]


@pytest.mark.parametrize("backend_name", ["xla", "reference"])
def test_the_pool_is_two_donated_arrays_never_copied(backend_name):
  forward, burst, pool_shape = _optimized_hlo(backend_name)
  for text in (forward, burst):
    entry = _entry(text)
    params = re.findall(rf"= {re.escape(pool_shape)}\{{[\d,]+\}} parameter\((\d+)\)", entry)
    assert len(params) == 2, params  # k_pool and v_pool, whatever the layer count
    aliases = text.splitlines()[0]  # the HloModule line: input_output_alias={ ... }
    for index in params:
      assert f"({index}, {{}}, may-alias)" in aliases, (index, aliases)
    copies = [line for line in text.splitlines() if f"{pool_shape}" in line and " copy(" in line]
    assert not copies, copies
