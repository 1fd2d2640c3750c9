"""An engine core's own devices when several cores share a host (data_parallel_size > 1):
jax.devices()[start : start + count], its first one made the process's default device.

The slice is what core/device_groups.py planned for the core (start 0 where a visibility
variable left only its devices visible; its first device's index where it sees them all, as
on the CPU). The default device carries the one-device placement (weights, KV pages, step
inputs) to the core's device, uncommitted, exactly as a one-device engine of a whole process
places them (committed weights would give the serving steps other jit cache keys than warmup
compiled); check_default_device refuses a one-device placement on devices that are not the
default. A mesh (tensor_parallel_size > 1) is built over the slice itself
(parallel/placement.py). The default is set for the whole process: an engine core process
serves one engine.
"""

from __future__ import annotations

import jax


def select_devices(start: int, count: int, platform: str | None = None) -> list[jax.Device]:
  """The slice, with its first device the default one; ValueError naming data_parallel_size
  when the process sees fewer devices, or none of `platform` ("gpu", "tpu": the devices its
  visibility variable named do not exist)."""
  devices = jax.devices()
  if platform is not None and devices[0].platform != platform:
    raise ValueError(
      f"data_parallel_size: this engine core was given {platform.upper()} devices "
      f"{start} to {start + count - 1} but sees none ({devices[0].platform} only): the host has "
      "fewer than data_parallel_size x tensor_parallel_size"
    )
  if start + count > len(devices):
    raise ValueError(
      f"data_parallel_size: this engine core takes devices {start} to {start + count - 1} "
      f"(data_parallel_size x tensor_parallel_size devices in all), but the process sees "
      f"{len(devices)}"
    )
  chosen = list(devices[start : start + count])
  jax.config.update("jax_default_device", chosen[0])
  return chosen


def check_default_device(device: jax.Device) -> None:
  """ValueError unless `device` is where uncommitted arrays go (select_devices made it so)."""
  default = jax.config.jax_default_device or jax.devices()[0]
  if isinstance(default, str):  # a platform's name: its first device
    default = jax.devices(default)[0]
  if default != device:
    raise ValueError(
      f"a one-device engine on {device} needs it as the default device (it is {default}): "
      "choose the engine's devices with select_devices"
    )
