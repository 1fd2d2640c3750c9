"""Which device platform a configuration needs, and the line that installs JAX's support for it:
the one owner of the platform install lines README.md gives (tests/device/test_platform_needs.py
checks that README says the same).

A key whose value runs on one platform only makes the configuration need that platform:
attention_backend pallas_gpu (the Pallas GPU kernel: an NVIDIA GPU) and pallas_tpu (a TPU).
"auto" and the other backends run anywhere.

check_platform(config, platform) is a one-line ValueError naming the key, the platform and what
to do, when the installed JAX has no support for the platform `config` needs (no CUDA or ROCm
plugin: the CPU-only build that `pip install -e .` gives; no libtpu): the error names the
install line. The CLI checks that before any work (platform None: JAX not started; found
without importing anything). Given the platform JAX started on, a supported platform JAX found
no device of (a driver it cannot use, devices hidden by CUDA_VISIBLE_DEVICES or JAX_PLATFORMS) is
one line too. An engine built in-process (LLM, tests) is not checked: there pallas_gpu and
pallas_tpu off their device run the kernels in Pallas interpret mode (config/engine.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

from jaxserve.config import EngineConfig
from jaxserve.device.platforms import CUDA_PLUGINS, ROCM_PLUGINS, installed

# platform -> the README's line that installs jaxserve with JAX's support for it
INSTALL_LINES: Mapping[str, str] = {
  "gpu": 'pip install -e ".[cuda]"',
  "tpu": 'pip install -e ".[tpu]"',
}
# platform -> what JAX's support for it is, and the modules that are it
SUPPORT: Mapping[str, tuple[str, tuple[str, ...]]] = {
  "gpu": ("JAX's CUDA build", CUDA_PLUGINS + ROCM_PLUGINS),
  "tpu": ("libtpu", ("libtpu",)),
}


def needed_platform(config: EngineConfig) -> str | None:
  """The platform `config` runs on only ("gpu", "tpu"), or None (any)."""
  return config.kernels.attention.platform


def _jax_version() -> str:
  try:
    return version("jax")
  except PackageNotFoundError:
    return "not installed"


def check_platform(config: EngineConfig, platform: str | None = None) -> None:
  """ValueError when JAX cannot run `config` on the platform it needs; `platform`: the one JAX
  started on ("cpu", "gpu", "tpu"), None before it starts (see the module docstring)."""
  needed = needed_platform(config)
  if needed is None or needed == platform:
    return
  key = f"attention_backend: {config.attention_backend} runs on a {needed.upper()}"
  support, modules = SUPPORT[needed]
  if not installed(modules):
    raise ValueError(
      f"{key}, and this JAX ({_jax_version()}) has no {needed.upper()} support ({support} is "
      f"not installed): {INSTALL_LINES[needed]}"
    )
  if platform is not None:
    raise ValueError(
      f"{key}, and JAX found none (it runs on the {platform.upper()}); check that the device is "
      "visible (CUDA_VISIBLE_DEVICES, JAX_PLATFORMS), or set attention_backend auto"
    )
