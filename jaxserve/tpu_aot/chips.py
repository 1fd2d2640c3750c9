"""TPU chips and their topologies: what a compile-only mesh is built from.

A chip is named by its Cloud TPU generation ("v5e", "v6e"). Its HBM per chip is the published
figure (v5e 16 GiB, v6e 32 GiB); XLA may use less of it, the "available HBM" that libtpu's
compiler reports when a program overflows it (v5e 15.75 GiB, v6e 31.25 GiB). The memory check
works against that figure and takes it for the device's bytes_limit, from which the engine sizes
the KV pool (an assumption, not checked against a TPU's memory_stats()). Its HBM bandwidth and
bfloat16 peak are the published figures too (v5e 819 GB/s and 197 TFLOP/s, v6e 1640 GB/s and
918 TFLOP/s): the decode roofline's ceilings (roofline.py).

A topology name ("v5e:2x4") is what libtpu compiles for: the devices of
jax.experimental.topologies.get_topology_desc hold no memory and run nothing, but programs lowered
onto a mesh of them compile as on the slice. A one-chip topology ("v5e:1x1") is smaller than
libtpu's default host of 2x2 chips and names its own host bounds. libtpu must be installed (the
`jax[tpu]` extra); the topology API is looked up at call time, so hosts without libtpu still
import this module. libtpu takes a lock file (/tmp/libtpu_lockfile) for the real chips it would
drive; topology_devices sets ALLOW_MULTIPLE_LIBTPU_LOAD (unless the environment sets it) before
libtpu loads, so a compile-only build runs beside other JAX processes.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass

import jax

from jaxserve.runtime.optional_deps import install_command

GIB = 2**30
# Chips per host slice -> the topology of that many chips (the single-host shapes Cloud TPU sells).
_SHAPES = {1: "1x1", 4: "2x2", 8: "2x4"}
# Topologies smaller than libtpu's default host (2x2x1 chips) name their own host bounds.
_HOST_BOUNDS = {"1x1": (1, 1, 1)}


@dataclass(frozen=True)
class TpuChip:
  name: str  # the generation as topology names spell it: "v5e", "v6e"
  hbm_bytes: int  # HBM per chip
  usable_bytes: int  # of which XLA may allocate (libtpu's "available HBM")
  device_kind: str  # jax Device.device_kind of its topology devices
  hbm_bytes_per_s: float  # published HBM bandwidth per chip
  peak_flops: float  # published bfloat16 peak per chip, FLOP/s

  def topology(self, num_chips: int) -> str:
    """The topology name of a one-host slice of num_chips chips, e.g. "v5e:2x4"."""
    if num_chips not in _SHAPES:
      raise ValueError(
        f"tensor_parallel_size: no single-host {self.name} topology of "
        f"{num_chips} chips (known: {', '.join(map(str, _SHAPES))})"
      )
    return f"{self.name}:{_SHAPES[num_chips]}"


CHIPS = {
  "v5e": TpuChip("v5e", 16 * GIB, 63 * GIB // 4, "TPU v5 lite", 819e9, 197e12),
  "v6e": TpuChip("v6e", 32 * GIB, 125 * GIB // 4, "TPU v6 lite", 1640e9, 918e12),
}


def get_chip(name: str) -> TpuChip:
  if name not in CHIPS:
    raise ValueError(f"chip: unknown {name!r} (known: {', '.join(CHIPS)})")
  return CHIPS[name]


def chip_of_config_name(config_path: str | None) -> TpuChip | None:
  """The chip a shipped config is named after (configs/v5e-8.yaml -> v5e), if any."""
  stem = (config_path or "").replace("\\", "/").rsplit("/", 1)[-1]
  return next((chip for name, chip in CHIPS.items() if stem.startswith(f"{name}-")), None)


def libtpu_available() -> bool:
  return importlib.util.find_spec("libtpu") is not None


def topology_devices(topology_name: str) -> Sequence[jax.Device]:
  """The devices of a TPU topology, compile-only; ValueError without libtpu."""
  if not libtpu_available():
    raise ValueError(
      f"compile-tpu: libtpu is not installed: {install_command(['tpu'])} (or the test extra, "
      "on Linux x86-64)"
    )
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies

  bounds = _HOST_BOUNDS.get(topology_name.rsplit(":", 1)[-1])
  options = {} if bounds is None else {"chips_per_host_bounds": bounds}
  try:
    description = topologies.get_topology_desc(
      topology_name=topology_name, platform="tpu", **options
    )
  except TypeError:  # a JAX whose signature lost the keywords
    description = topologies.get_topology_desc(topology_name, "tpu", **options)
  return list(description.devices)
