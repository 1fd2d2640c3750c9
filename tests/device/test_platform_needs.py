"""A configuration that needs a platform this JAX cannot run fails at once, in one line that
names the key and the install line (jaxserve/device/platform_needs.py): `jaxserve serve --config
configs/h100.yaml` on a CPU-only JAX exits 2 before any work. README.md gives the same install
lines."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from jaxserve.config import EngineConfig
from jaxserve.device.platform_needs import INSTALL_LINES, SUPPORT, check_platform
from jaxserve.device.platforms import installed

REPO = Path(__file__).resolve().parents[2]
GPU_SUPPORT = installed(SUPPORT["gpu"][1])


@pytest.mark.skipif(GPU_SUPPORT, reason="JAX's GPU support is installed here")
def test_a_gpu_config_on_a_cpu_only_jax_is_one_line_naming_the_install(tmp_path):
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "jaxserve.cli",
      "serve",
      "--config",
      str(REPO / "configs" / "h100.yaml"),
    ],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=tmp_path,
  )
  assert run.returncode == 2, run.stderr
  assert run.stderr.strip().splitlines() == [
    "jaxserve serve: error: attention_backend: pallas_gpu runs on a GPU, and this JAX "
    f"({version('jax')}) has no GPU support (JAX's CUDA build is not installed): "
    'pip install -e ".[cuda]"'
  ]
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("backend,platform", [("pallas_gpu", "gpu"), ("pallas_tpu", "tpu")])
def test_each_pallas_backend_needs_its_platform(backend, platform):
  config = EngineConfig(attention_backend=backend)
  check_platform(config, platform)  # on its own platform: nothing to say
  support, modules = SUPPORT[platform]
  if installed(modules):  # the support is there: before JAX starts, nothing to say either
    check_platform(config)
    expected = f"{backend} runs on a {platform.upper()}, and JAX found none (it runs on the CPU)"
  else:
    expected = f"({support} is not installed): {INSTALL_LINES[platform]}"
    with pytest.raises(ValueError, match="^attention_backend: ") as err:
      check_platform(config)
    assert str(err.value).endswith(expected)
  with pytest.raises(ValueError, match="^attention_backend: ") as err:
    check_platform(config, "cpu")
  assert expected in str(err.value)
  for anywhere in ("auto", "xla", "reference"):
    check_platform(EngineConfig(attention_backend=anywhere), "cpu")


def test_readme_gives_the_install_lines():
  readme = (REPO / "README.md").read_text()
  for line in INSTALL_LINES.values():
    assert f"`{line}`" in readme, line
