"""The JAX client's share of an accelerator: XLA_CLIENT_MEM_FRACTION set from
cache.memory_fraction before the backend starts, and the share a client's limit stands for.

The JAX GPU client pre-allocates XLA_CLIENT_MEM_FRACTION of the card (default 0.75) when its
backend starts and can never allocate beyond it, so `configure_client_memory(fraction)` sets
XLA_CLIENT_MEM_FRACTION=fraction before that happens: the client's arena is then exactly the share
(and device/device_memory.py's pool = arena - in use - scratch). Pre-allocation stays on (JAX's
default): one arena for weights, pool and scratch, no allocation on the serving path, no
fragmentation from growth; and XLA_PYTHON_CLIENT_PREALLOCATE=false alone would not help, the 0.75
cap applies to growth too. (XLA_CLIENT_MEM_FRACTION is the spelling used where the installed jaxlib
reads it, else XLA_PYTHON_CLIENT_MEM_FRACTION; jaxlib raises if both are set, so neither is added
next to the other.)

A user's own XLA_CLIENT_MEM_FRACTION / XLA_PYTHON_CLIENT_MEM_FRACTION / _PREALLOCATE / _ALLOCATOR
win: nothing is set and a log line says so; the device's total is then inferred from the client's
limit and the fraction it was given (0.75 if none). Nothing is set when no GPU plugin is installed
or JAX_PLATFORMS excludes GPUs, or once a backend has started (too late: said in the log). On TPU
the client's limit is the whole device. How much of that share the KV pool gets is
device/device_memory.py's.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pkgutil
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

FRACTION_VAR = "XLA_CLIENT_MEM_FRACTION"
FRACTION_VARS = (FRACTION_VAR, "XLA_PYTHON_CLIENT_MEM_FRACTION")
CLIENT_VARS = FRACTION_VARS + ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR")
JAX_DEFAULT_GPU_FRACTION = 0.75
GPU_PLATFORMS = ("gpu", "cuda", "rocm")
GPU_PLUGIN_PACKAGES = (
  "jax_cuda12_plugin",
  "jax_cuda13_plugin",
  "jax_rocm60_plugin",
  "jax_rocm7_plugin",
)


@dataclass(frozen=True)
class ClientMemorySetup:
  """What configure_client_memory does to the environment, and why."""

  set_vars: Mapping[str, str] = field(default_factory=dict)
  user_vars: Mapping[str, str] = field(default_factory=dict)
  note: str = ""


def client_memory_env(
  fraction: float,
  environ: Mapping[str, str],
  *,
  gpu: bool,
  backend_started: bool,
  var: str = FRACTION_VAR,
) -> ClientMemorySetup:
  """The XLA_* variables to set for `fraction` of the device (pure); `var` is the spelling of
  the fraction variable that the installed jaxlib reads."""
  value = f"{fraction:g}"
  user = {name: environ[name] for name in CLIENT_VARS if name in environ}
  if user == {var: value}:
    return ClientMemorySetup(user_vars=user)  # already set to this (by us or identically)
  if user:
    settings = " ".join(f"{k}={v}" for k, v in user.items())
    return ClientMemorySetup(
      user_vars=user,
      note=(
        f"device memory: {settings} set by the user wins over cache.memory_fraction {value} "
        "for the JAX client's pre-allocation"
      ),
    )
  if not gpu:
    return ClientMemorySetup()
  if backend_started:
    return ClientMemorySetup(
      note=(
        "device memory: JAX backend already started, its pre-allocation is fixed; "
        f"cache.memory_fraction {value} applies within the client's limit"
      )
    )
  return ClientMemorySetup(
    set_vars={var: value},
    note=(
      f"device memory: {var}={value} (cache.memory_fraction): the JAX client "
      f"pre-allocates {fraction:.0%} of each GPU"
    ),
  )


def configure_client_memory(
  fraction: float, environ: MutableMapping[str, str] | None = None, *, gpu: bool | None = None
) -> ClientMemorySetup:
  """Sets the JAX client's memory fraction; call at process start, before jax uses a device."""
  environ = os.environ if environ is None else environ
  setup = client_memory_env(
    fraction,
    environ,
    gpu=gpu_expected(environ) if gpu is None else gpu,
    backend_started=backend_started(),
    var=fraction_var(),
  )
  environ.update(setup.set_vars)
  if setup.note:
    logger.info("%s", setup.note)
  return setup


def gpu_expected(environ: Mapping[str, str]) -> bool:
  """Whether jax may start a GPU backend: a CUDA/ROCm plugin is installed and JAX_PLATFORMS
  (if set) allows it. Imports no jax."""
  platforms = environ.get("JAX_PLATFORMS", "")
  if platforms and not any(p.strip() in GPU_PLATFORMS for p in platforms.lower().split(",")):
    return False
  if any(importlib.util.find_spec(name) is not None for name in GPU_PLUGIN_PACKAGES):
    return True
  if importlib.util.find_spec("jax_plugins") is None:
    return False
  import jax_plugins

  return any(
    m.name.startswith(("xla_cuda", "xla_rocm", "cuda", "rocm"))
    for m in pkgutil.iter_modules(jax_plugins.__path__)
  )


def fraction_var() -> str:
  """XLA_CLIENT_MEM_FRACTION where the installed jaxlib reads it (0.10 does, preferring it to the
  deprecated spelling), else XLA_PYTHON_CLIENT_MEM_FRACTION. Reads jaxlib's source, imports
  nothing."""
  spec = importlib.util.find_spec("jaxlib.xla_client")
  try:
    source = open(spec.origin, encoding="utf-8").read() if spec and spec.origin else ""
  except OSError:
    source = ""
  return FRACTION_VAR if f"'{FRACTION_VAR}'" in source else FRACTION_VARS[1]


def backend_started() -> bool:
  """Whether jax has initialized a backend in this process (never initializes one)."""
  bridge = sys.modules.get("jax._src.xla_bridge")
  started = getattr(bridge, "backends_are_initialized", None)
  return bool(started and started())


def client_share(platform: str, environ: Mapping[str, str]) -> float:
  """The share of the device the client's limit stands for."""
  if platform not in GPU_PLATFORMS:
    return 1.0
  for name in FRACTION_VARS:
    if environ.get(name):
      return float(environ[name])
  return JAX_DEFAULT_GPU_FRACTION
