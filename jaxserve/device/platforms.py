"""Which JAX platforms a jaxserve process starts: no TPU probe where no TPU is attached.

libtpu comes with the `test` and `tpu` extras (for `jaxserve compile-tpu`). Where it is installed,
JAX's backend discovery initializes it at the first device use even on a machine with no TPU, and
libtpu writes several warning lines and an INVALID_ARGUMENT error to stderr (its own logging,
which Python's logging cannot filter) before JAX falls back to the CPU or GPU. A process that
serves on this machine's own devices (every command but compile-tpu, `LLM(...)`, the benchmarks)
calls `skip_absent_tpu()` (through `prepare_jax_process`) before JAX starts a backend: where libtpu
is installed, no TPU device file exists (/dev/accel<n> on v2-v5e hosts, /dev/vfio/<n> on v5p and
v6e) and JAX_PLATFORMS is unset, it sets JAX_PLATFORMS to the platforms that can start ("cuda,cpu"
or "rocm,cpu" where a GPU plugin is installed, else "cpu") and logs that it did. A user's own
JAX_PLATFORMS wins. compile-tpu loads libtpu itself for a topology and never calls it.

JAX reads JAX_PLATFORMS once, when it is imported; the CLI sets it before, but a library user's
`from jaxserve import LLM` imports jax (and their own code may have) before `LLM(...)` calls
`skip_absent_tpu()`. Where jax is already imported and has no backend yet, it therefore also sets
jax's `jax_platforms` option to the same value. Nothing happens at `import jaxserve`: the
environment and jax's options change only in a process that goes on to start a backend through
jaxserve (and only where libtpu is installed with no TPU attached, where the TPU cannot start
anyway); a child process inherits JAX_PLATFORMS, as one the CLI starts does.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import sys
from collections.abc import MutableMapping, Sequence

from jaxserve.device.client_memory import (
  ClientMemorySetup,
  backend_started,
  configure_client_memory,
)

logger = logging.getLogger(__name__)

TPU_DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
ROCM_PLUGINS = ("jax_rocm60_plugin", "jax_rocm7_plugin")


def installed(names: Sequence[str]) -> bool:
  return any(importlib.util.find_spec(name) is not None for name in names)


def tpu_attached(device_globs: Sequence[str] = TPU_DEVICE_GLOBS) -> bool:
  """Whether this host has a TPU device file (without starting anything)."""
  return any(glob.glob(pattern) for pattern in device_globs)


def platforms_without_tpu(*, cuda: bool, rocm: bool) -> str:
  """The JAX_PLATFORMS value that starts every backend of this machine but the TPU's."""
  return ",".join([p for p, on in (("cuda", cuda), ("rocm", rocm)) if on] + ["cpu"])


def platforms_to_set(
  environ: MutableMapping[str, str], *, libtpu: bool, tpu: bool, cuda: bool, rocm: bool
) -> str | None:
  """JAX_PLATFORMS to set, or None to leave the environment as it is."""
  if environ.get("JAX_PLATFORMS") or not libtpu or tpu:
    return None
  return platforms_without_tpu(cuda=cuda, rocm=rocm)


def skip_absent_tpu(environ: MutableMapping[str, str] | None = None) -> str | None:
  """Sets JAX_PLATFORMS so that an installed libtpu is not probed on a host with no TPU; returns
  the value set (None: nothing set). Call before JAX starts a backend; imports no jax."""
  environ = os.environ if environ is None else environ
  if backend_started():  # too late to matter here, and children should not inherit it
    return None
  value = platforms_to_set(
    environ,
    libtpu=installed(("libtpu",)),
    tpu=tpu_attached(),
    cuda=installed(CUDA_PLUGINS),
    rocm=installed(ROCM_PLUGINS),
  )
  if value is not None:
    environ["JAX_PLATFORMS"] = value
    jax = sys.modules.get("jax")
    if environ is os.environ and jax is not None:  # imported before: it read JAX_PLATFORMS then
      jax.config.update("jax_platforms", value)
    logger.debug("libtpu is installed but no TPU is attached: JAX_PLATFORMS=%s", value)
  return value


def prepare_jax_process(memory_fraction: float) -> ClientMemorySetup:
  """What every process that serves on this machine's devices does before JAX starts a backend
  (the CLI's commands, LLM(...), the benchmarks): no libtpu probe without a TPU, and the JAX
  client's arena set to cache.memory_fraction (device/client_memory.py)."""
  skip_absent_tpu()
  return configure_client_memory(memory_fraction)
