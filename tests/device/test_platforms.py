"""No libtpu probe on a host without a TPU (jaxserve/device/platforms.py): the rule, and the stderr
of a real process that starts JAX with libtpu installed."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from jaxserve.device.platforms import platforms_to_set, tpu_attached

REPO = Path(__file__).resolve().parents[2]
LIBTPU_NOISE = ("TPU_ACCELERATOR_TYPE", "INVALID_ARGUMENT", "libtpu")


def test_rule():
  assert platforms_to_set({}, libtpu=True, tpu=False, cuda=False, rocm=False) == "cpu"
  assert platforms_to_set({}, libtpu=True, tpu=False, cuda=True, rocm=False) == "cuda,cpu"
  assert platforms_to_set({}, libtpu=True, tpu=False, cuda=False, rocm=True) == "rocm,cpu"
  assert platforms_to_set({}, libtpu=True, tpu=True, cuda=False, rocm=False) is None  # a TPU VM
  assert platforms_to_set({}, libtpu=False, tpu=False, cuda=True, rocm=False) is None
  # the user's own choice wins
  assert (
    platforms_to_set({"JAX_PLATFORMS": "tpu"}, libtpu=True, tpu=False, cuda=False, rocm=False)
    is None
  )


def test_device_files(tmp_path):
  assert not tpu_attached((str(tmp_path / "accel[0-9]*"),))
  (tmp_path / "accel0").touch()
  assert tpu_attached((str(tmp_path / "accel[0-9]*"),))


START_JAX = (
  "import sys; sys.path.insert(0, {repo!r}); from jaxserve.device.platforms import "
  "skip_absent_tpu; {call}; import jax; print(jax.devices()[0].platform)"
)


def _stderr_of(call: str) -> tuple[str, str]:
  env = {
    k: v
    for k, v in __import__("os").environ.items()
    if k not in ("JAX_PLATFORMS", "ALLOW_MULTIPLE_LIBTPU_LOAD")
  }
  env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # other test processes may hold libtpu's lock
  done = subprocess.run(
    [sys.executable, "-c", START_JAX.format(repo=str(REPO), call=call)],
    capture_output=True,
    text=True,
    env=env,
    timeout=120,
  )
  assert done.returncode == 0, done.stderr
  return done.stdout.strip(), done.stderr


@pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None or tpu_attached(),
  reason="needs libtpu installed on a host without a TPU",
)
def test_no_libtpu_noise_when_no_tpu_is_attached():
  platform, noisy = _stderr_of("None")  # JAX on its own probes libtpu
  assert any(word in noisy for word in LIBTPU_NOISE), noisy
  platform_quiet, quiet = _stderr_of("skip_absent_tpu()")
  assert platform_quiet == platform
  assert not any(word in quiet for word in LIBTPU_NOISE), quiet
  # a library user's `from jaxserve import LLM` imports jax before LLM(...) calls it
  platform_late, late = _stderr_of("from jaxserve.entrypoints import llm; skip_absent_tpu()")
  assert platform_late == platform
  assert not any(word in late for word in LIBTPU_NOISE), late
