"""Which devices each engine core owns when `jaxserve serve` runs data_parallel_size of them on
one host (a pure rule: no jax; the supervisor plans, each core process applies its group).

Engine core i of N (data_parallel_size), each on tp (tensor_parallel_size) devices, owns devices
i*tp .. (i+1)*tp - 1 of the host. How a core is confined to them depends on the accelerator:

* GPUs: CUDA_VISIBLE_DEVICES, set in the core process before jax starts, to its tp entries (of
  the parent's CUDA_VISIBLE_DEVICES when that is set, else of the indices 0..). A device slice
  alone would not do on a GPU: the JAX client of every process opens every visible GPU and
  reserves its memory arena (configure_client_memory's fraction) on each, so two cores that
  both saw both GPUs would each hold memory on the other's card, and a core's memory statistics
  and device defaults read its first visible device (device/device_memory.py).
* TPU chips: only one process may open a chip, so the same holds: TPU_VISIBLE_CHIPS with the
  per-process bounds of a tp-chip process (TPU_CHIPS_PER_PROCESS_BOUNDS, TPU_PROCESS_BOUNDS
  1,1,1) and a mesh controller port of its own per core (TPU_MESH_CONTROLLER_ADDRESS / _PORT).
  Written from libtpu's documented variables; not yet run on a TPU host.
* Anything else (the CPU, where tests force several host devices with
  --xla_force_host_platform_device_count): no variable confines a process, so the core takes the
  slice [first, first + tp) of jax.devices() (parallel/device_slice.py).

Either way the core ends up with `DeviceGroup.slice_start`: 0 where the variables left only its
own devices visible, `first` where it sees every device. The accelerators are counted from their
device files (/dev/nvidiaN, else the driver's /proc/driver/nvidia/gpus/; /dev/accelN or
/dev/vfio/N), the way device/platforms.py finds a TPU,
so the supervisor (which never imports jax) refuses data_parallel_size x tensor_parallel_size
devices more than the host has, naming data_parallel_size; on the CPU the core process checks
once jax is up (parallel/device_slice.py), which also refuses a GPU or TPU group whose
process finds no such device (a variable naming devices that do not exist).
"""

from __future__ import annotations

import glob
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

GPU = "gpu"
TPU = "tpu"
SLICE = "slice"  # no visibility variable: a slice of jax.devices()
GPU_DEVICE_GLOB = "/dev/nvidia[0-9]*"
GPU_DRIVER_GLOB = "/proc/driver/nvidia/gpus/*"  # where a container has no /dev/nvidiaN
TPU_DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
TPU_MESH_PORT_BASE = 8476
# a tp-chip process's chip bounds (x,y,z), as libtpu takes them
TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}


@dataclass(frozen=True)
class DeviceGroup:
  """Engine core `index`'s devices: `count` of them from the host's device `first`; `env` the
  variables its process sets before jax starts; its devices are jax.devices()[slice_start:
  slice_start + count] once it has."""

  index: int
  first: int
  count: int
  kind: str  # GPU, TPU or SLICE
  env: tuple[tuple[str, str], ...] = ()

  @property
  def slice_start(self) -> int:
    return self.first if self.kind == SLICE else 0

  @property
  def platform(self) -> str | None:
    """The jax platform its devices must have (None: any, a slice)."""
    return None if self.kind == SLICE else self.kind

  def describe(self) -> str:
    last = self.first + self.count - 1
    devices = f"device {self.first}" if self.count == 1 else f"devices {self.first}-{last}"
    how = f"{self.env[0][0]}={self.env[0][1]}" if self.env else "a slice of jax.devices()"
    return f"engine core {self.index}: {devices} ({how})"


@dataclass(frozen=True)
class Accelerators:
  """What the host has, from its device files: `kind` (GPU, TPU or SLICE) and how many."""

  kind: str
  count: int | None  # None: unknown until jax starts (SLICE)


def detect_accelerators(
  environ: Mapping[str, str], find: Callable[[str], list[str]] = glob.glob
) -> Accelerators:
  """GPUs or TPU chips by their device files (`find`: glob), unless JAX_PLATFORMS names
  neither (a CPU run)."""
  platforms = environ.get("JAX_PLATFORMS", "").lower()
  gpus = [g for g in find(GPU_DEVICE_GLOB) if re.fullmatch(r"/dev/nvidia\d+", g)]
  gpus = gpus or find(GPU_DRIVER_GLOB)
  if gpus and (not platforms or "cuda" in platforms or "gpu" in platforms):
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    count = len(_split(visible)) if visible is not None else len(gpus)
    return Accelerators(GPU, count)
  chips = [p for pattern in TPU_DEVICE_GLOBS for p in find(pattern)]
  if chips and (not platforms or "tpu" in platforms):
    return Accelerators(TPU, len(chips))
  return Accelerators(SLICE, None)


def plan_device_groups(
  data_parallel_size: int,
  tensor_parallel_size: int,
  accelerators: Accelerators,
  environ: Mapping[str, str],
) -> list[DeviceGroup]:
  """One DeviceGroup per engine core; ValueError naming data_parallel_size when the host has
  fewer devices than data_parallel_size x tensor_parallel_size."""
  dp, tp = data_parallel_size, tensor_parallel_size
  needed = dp * tp
  if accelerators.count is not None and needed > accelerators.count:
    raise ValueError(
      f"data_parallel_size: {dp} engine cores x tensor_parallel_size {tp} need {needed} "
      f"devices, more than the {accelerators.count} {accelerators.kind.upper()} device(s) of "
      "this host"
    )
  return [_group(i, tp, accelerators.kind, environ) for i in range(dp)]


def _group(index: int, tp: int, kind: str, environ: Mapping[str, str]) -> DeviceGroup:
  first = index * tp
  if kind == GPU:
    visible = _split(environ.get("CUDA_VISIBLE_DEVICES")) or [str(i) for i in range(first + tp)]
    ids = ",".join(visible[first : first + tp])
    return DeviceGroup(index, first, tp, kind, (("CUDA_VISIBLE_DEVICES", ids),))
  if kind == TPU:
    port = str(TPU_MESH_PORT_BASE + index)
    env = (
      ("TPU_VISIBLE_CHIPS", ",".join(str(c) for c in range(first, first + tp))),
      ("TPU_CHIPS_PER_PROCESS_BOUNDS", TPU_CHIP_BOUNDS.get(tp, f"1,{tp},1")),
      ("TPU_PROCESS_BOUNDS", "1,1,1"),
      ("TPU_MESH_CONTROLLER_ADDRESS", f"localhost:{port}"),
      ("TPU_MESH_CONTROLLER_PORT", port),
    )
    return DeviceGroup(index, first, tp, kind, env)
  return DeviceGroup(index, first, tp, SLICE)


def _split(value: str | None) -> Sequence[str]:
  return [v.strip() for v in value.split(",") if v.strip()] if value else []
