"""An engine core of several on one host takes its own slice of the devices
(parallel/device_slice.py, the CPU's way: core/device_groups.py): its weights, KV pages and mesh
live on those devices only, its greedy tokens are those of an engine on the first devices, and
after a full warmup its steps compile nothing."""

from __future__ import annotations

import jax
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.composition.assembly import build_engine
from jaxserve.parallel.device_slice import select_devices
from jaxserve.parallel.placement import load_placement
from tests.integration.engine_helpers import run_to_completion, small_config


@pytest.fixture
def default_device_restored():
  yield
  jax.config.update("jax_default_device", None)


def _device_ids(tree) -> set[int]:
  return {d.id for leaf in jax.tree_util.tree_leaves(tree) for d in leaf.sharding.device_set}


def test_a_sharded_core_lives_on_its_slice(default_device_restored):
  devices = select_devices(4, 2)
  placement = load_placement(small_config(tensor_parallel_size=2), devices)
  assert [d.id for d in placement.mesh.devices.flat] == [4, 5]
  assert _device_ids(placement.model.params) == {4, 5}
  assert jax.config.jax_default_device == jax.devices()[4]


def test_a_one_device_core_runs_on_its_device_and_computes_the_same(default_device_restored):
  config = small_config(
    num_pages=32,
    max_num_seqs=2,
    max_tokens_per_step=16,
    seq_buckets=(2,),
    token_buckets=(16,),
    max_model_len=64,
  )
  reference = build_engine(config, show_progress=False, default_warmup="lazy")
  expected = _greedy(reference)
  reference.close()
  devices = select_devices(3, 1)
  engine = build_engine(
    config.replace(data_parallel_size=4),
    show_progress=False,
    default_warmup="full",
    devices=devices,
  )
  try:
    assert _device_ids(engine.runner.params) == {3}
    warmed_up = engine.ledger.num_compilations
    assert _greedy(engine) == expected
    # the steps hit warmup's programs: weights committed to device 3 would give every step a
    # jit cache key of its own
    assert engine.ledger.num_compilations == warmed_up
  finally:
    engine.close()


def test_a_one_device_placement_off_the_default_device_is_refused(default_device_restored):
  select_devices(2, 1)
  with pytest.raises(ValueError, match="needs it as the default device"):
    load_placement(small_config(), [jax.devices()[5]])


def _greedy(engine) -> list[list[int]]:
  params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
  for i, prompt in enumerate([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]]):
    engine.add_request(prompt, params, request_id=f"r{i}")
  finished = run_to_completion(engine)
  return [list(finished[f"r{i}"].token_ids) for i in range(2)]


def test_a_slice_past_the_devices_is_refused_naming_the_field():
  with pytest.raises(
    ValueError, match="^data_parallel_size: this engine core takes devices 8 to 9 "
  ):
    select_devices(8, 2)


def test_a_gpu_group_that_finds_no_gpu_is_refused_naming_the_field():
  with pytest.raises(ValueError, match="^data_parallel_size: this engine core was given GPU"):
    select_devices(0, 1, "gpu")
