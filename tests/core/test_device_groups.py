"""Which devices each engine core owns (core/device_groups.py), pure: the accelerators found from
device files, the variables each core process sets, the slice of jax.devices() it takes, and the
refusal, naming data_parallel_size, of more devices than the host has."""

from __future__ import annotations

import fnmatch

import pytest

from jaxserve.core.device_groups import (
  GPU,
  SLICE,
  TPU,
  Accelerators,
  detect_accelerators,
  plan_device_groups,
)


def files(*paths: str):
  """A glob over these paths alone."""
  return lambda pattern: [p for p in paths if fnmatch.fnmatch(p, pattern)]


def test_accelerators_from_device_files():
  gpus = files("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm")
  assert detect_accelerators({}, gpus) == Accelerators(GPU, 2)
  assert detect_accelerators({"CUDA_VISIBLE_DEVICES": "3"}, gpus) == Accelerators(GPU, 1)
  assert detect_accelerators({"JAX_PLATFORMS": "cpu"}, gpus) == Accelerators(SLICE, None)
  chips = files("/dev/accel0", "/dev/accel1", "/dev/accel2", "/dev/accel3")
  assert detect_accelerators({}, chips) == Accelerators(TPU, 4)
  assert detect_accelerators({}, files()) == Accelerators(SLICE, None)
  driver = files("/proc/driver/nvidia/gpus/0000:1a:00.0", "/proc/driver/nvidia/gpus/0000:1b:00.0")
  assert detect_accelerators({}, driver) == Accelerators(GPU, 2)


def test_gpus_are_confined_by_cuda_visible_devices():
  groups = plan_device_groups(2, 2, Accelerators(GPU, 4), {})
  assert [dict(g.env) for g in groups] == [
    {"CUDA_VISIBLE_DEVICES": "0,1"},
    {"CUDA_VISIBLE_DEVICES": "2,3"},
  ]
  assert [(g.first, g.count, g.slice_start) for g in groups] == [(0, 2, 0), (2, 2, 0)]
  inherited = plan_device_groups(2, 1, Accelerators(GPU, 2), {"CUDA_VISIBLE_DEVICES": "4,6"})
  assert [dict(g.env)["CUDA_VISIBLE_DEVICES"] for g in inherited] == ["4", "6"]
  assert groups[1].describe() == "engine core 1: devices 2-3 (CUDA_VISIBLE_DEVICES=2,3)"


def test_tpu_chips_get_their_own_process_bounds_and_port():
  groups = plan_device_groups(2, 2, Accelerators(TPU, 4), {})
  env = [dict(g.env) for g in groups]
  assert [e["TPU_VISIBLE_CHIPS"] for e in env] == ["0,1", "2,3"]
  assert {e["TPU_CHIPS_PER_PROCESS_BOUNDS"] for e in env} == {"1,2,1"}
  assert {e["TPU_PROCESS_BOUNDS"] for e in env} == {"1,1,1"}
  assert env[0]["TPU_MESH_CONTROLLER_PORT"] != env[1]["TPU_MESH_CONTROLLER_PORT"]


def test_elsewhere_each_core_takes_a_slice_of_every_device():
  groups = plan_device_groups(3, 2, Accelerators(SLICE, None), {})
  assert [(g.env, g.slice_start, g.count) for g in groups] == [((), 0, 2), ((), 2, 2), ((), 4, 2)]
  assert groups[2].describe() == "engine core 2: devices 4-5 (a slice of jax.devices())"


@pytest.mark.parametrize("kind", [GPU, TPU])
def test_more_devices_than_the_host_has_is_refused_naming_the_field(kind):
  with pytest.raises(
    ValueError,
    match=r"^data_parallel_size: 2 engine cores x "
    r"tensor_parallel_size 2 need 4 devices, more than the 2",
  ):
    plan_device_groups(2, 2, Accelerators(kind, 2), {})
