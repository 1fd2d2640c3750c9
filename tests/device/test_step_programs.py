"""build_step_programs is usable ahead of time: every step program lowers from abstract
arguments alone (jax.ShapeDtypeStruct, shardings attached on a mesh), with no params, KV pages or
runner allocated, which is how the programs are compiled for a topology this machine does not
have."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.attention import get_attention_backend
from jaxserve.device.kv_cache import allocate_kv_pages, kv_pool_shapes, kv_pool_spec
from jaxserve.device.lowering import abstract, dummy_inputs, standalone_dummy_inputs
from jaxserve.device.model_runner import ModelRunner, packed_model_inputs
from jaxserve.device.packing import pack
from jaxserve.device.sampler import SamplerMode
from jaxserve.device.step_inputs import PreviousSamples, StepShape, build_step_inputs
from jaxserve.device.step_programs import StepShardings, build_step_programs
from jaxserve.messages.buckets import Bucket, BucketSet
from jaxserve.messages.scheduled_batch import ScheduledBatch
from jaxserve.models.families.llama import LlamaForCausalLM
from jaxserve.models.tiny_random import tiny_random_config, tiny_random_params
from jaxserve.models.weights import param_shapes
from jaxserve.parallel.partition_rules import (
  build_mesh,
  kv_pages_sharding,
  logits_sharding,
  param_shardings,
  replicated,
)
from jaxserve.parallel.sharded_attention import shard_attention_backend

PAGE_SIZE, NUM_PAGES, BUCKET = 4, 8, Bucket(4, 16)


def _abstract_step(mesh):
  """(model, shardings, params, kv pages, step inputs), all abstract."""
  config = tiny_random_config()
  backend = get_attention_backend("xla")
  spec = kv_pool_spec(
    config.num_layers, config.num_kv_heads, config.head_dim, PAGE_SIZE, NUM_PAGES, config.dtype
  )
  shapes = param_shapes(config)
  if mesh is None:
    model, shardings, kv_sharding = LlamaForCausalLM(config, backend), None, None
    params = shapes
  else:
    model = LlamaForCausalLM(config, shard_attention_backend(backend, mesh))
    params = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      shapes,
      param_shardings(shapes, mesh),
    )
    kv_sharding = kv_pages_sharding(mesh)
  kv_pages = kv_pool_shapes(spec, kv_sharding)
  if mesh is not None:
    shardings = StepShardings(
      jax.tree.map(lambda x: x.sharding, params),
      jax.tree.map(lambda x: x.sharding, kv_pages),
      logits_sharding(params, mesh),
      replicated(mesh),
    )
  shape = StepShape(PAGE_SIZE, NUM_PAGES, PAGE_SIZE * NUM_PAGES, config.vocab_size)
  previous = PreviousSamples(np.zeros(BUCKET.num_seqs, np.int32), {})
  inputs = build_step_inputs(ScheduledBatch(), BUCKET, shape, previous)
  return model, shardings, params, kv_pages, inputs


@pytest.mark.parametrize("on_mesh", [False, True], ids=["one-device", "mesh"])
def test_every_step_program_lowers_from_abstract_arguments(on_mesh):
  mesh = build_mesh(1) if on_mesh else None
  model, shardings, params, kv_pages, inputs = _abstract_step(mesh)
  programs = build_step_programs(model, shardings, burst_steps=2, page_size=PAGE_SIZE)
  packed = abstract(packed_model_inputs(inputs))
  sampling = abstract(pack(inputs.sampling))
  prev = abstract(inputs.prev_sampled_ids)
  logits = jax.ShapeDtypeStruct((BUCKET.num_seqs, model.config.vocab_size), jnp.float32)
  hidden = jax.ShapeDtypeStruct(
    (BUCKET.num_tokens, model.config.hidden_size), jnp.dtype(model.config.dtype)
  )
  lowered = [
    programs.forward.lower(params, kv_pages, packed),
    programs.sample.lower(logits, sampling, prev, SamplerMode(random=True)),
    programs.prompt_logprobs.lower(params, hidden, abstract(inputs.prompt_target_ids)),
    programs.burst.lower(params, kv_pages, packed, sampling, SamplerMode()),
  ]
  for program in lowered:
    assert "func.func public @main" in program.as_text()
  compiled = lowered[0].compile()  # and they compile here, with no array allocated
  assert compiled is not None


def test_bursts_need_the_page_size():
  model = LlamaForCausalLM(tiny_random_config(), get_attention_backend("xla"))
  with pytest.raises(ValueError, match="page_size"):
    build_step_programs(model, burst_steps=4)
  with pytest.raises(ValueError, match="burst_steps"):
    build_step_programs(model, burst_steps=0)
  assert build_step_programs(model).burst is None


def test_standalone_dummy_inputs_pack_as_the_runners():
  """The inputs lowered without a runner (jaxserve/tpu_aot) have the layout of the runner's own
  warmup inputs: its cached constants stay device leaves, so every program's signature is the
  server's."""
  config = tiny_random_config()
  spec = kv_pool_spec(
    config.num_layers, config.num_kv_heads, config.head_dim, PAGE_SIZE, NUM_PAGES, config.dtype
  )
  model = LlamaForCausalLM(config, get_attention_backend("xla"))
  buckets = BucketSet((2, 4), (8, 16))
  shape = StepShape(PAGE_SIZE, NUM_PAGES, PAGE_SIZE * NUM_PAGES, config.vocab_size)
  runner = ModelRunner(
    model,
    tiny_random_params(config),
    allocate_kv_pages(spec),
    buckets,
    shape,
    build_step_programs(model),
  )
  for bucket in buckets.all():
    for mode in SamplerMode.all():
      ours, theirs = (
        standalone_dummy_inputs(buckets, shape, bucket, mode, True),
        dummy_inputs(runner, bucket, mode, True),
      )
      for part in (packed_model_inputs, lambda inputs: pack(inputs.sampling)):
        assert abstract(part(ours)) == abstract(part(theirs))
        assert part(ours).layout == part(theirs).layout
