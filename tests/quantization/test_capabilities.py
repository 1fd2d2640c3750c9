"""Which device runs which scheme (jaxserve/quantization/capabilities.py), on descriptions of real
devices (the compute capabilities NVIDIA publishes, the device kinds jax reports for TPU
topologies), and the engine asking before anything takes device memory."""

from __future__ import annotations

import jax
import pytest

from jaxserve.composition.assembly import build_engine
from jaxserve.config import EngineConfig
from jaxserve.quantization.capabilities import check_device_runs, refusal
from jaxserve.quantization.scheme import QUANTIZATION_NAMES, SCHEMES
from jaxserve.runtime.device_description import DeviceDescription

A100 = DeviceDescription("gpu", "8.0", "NVIDIA A100-SXM4-80GB")
L40S = DeviceDescription("gpu", "8.9", "NVIDIA L40S")
H100 = DeviceDescription("gpu", "9.0", "NVIDIA H100 80GB HBM3")
T4 = DeviceDescription("gpu", "7.5", "Tesla T4")
V100 = DeviceDescription("gpu", "7.0", "Tesla V100-SXM2-16GB")
MI300 = DeviceDescription("gpu", "gfx942", "AMD Instinct MI300X")
V4 = DeviceDescription("tpu", None, "TPU v4")
V5E = DeviceDescription("tpu", None, "TPU v5 lite")
V5P = DeviceDescription("tpu", None, "TPU v5")
V6E = DeviceDescription("tpu", None, "TPU v6 lite")
TPU7X = DeviceDescription("tpu", None, "TPU7x")
CPU = DeviceDescription("cpu", None, "cpu")

# device -> the W8A8 schemes it runs (every device runs none, fp8_w8a16 and int8)
RUNS_W8A8 = {
  CPU: {"fp8", "int8_w8a8"},
  H100: {"fp8", "int8_w8a8"},
  L40S: {"fp8", "int8_w8a8"},
  A100: {"int8_w8a8"},
  T4: {"int8_w8a8"},
  V100: set(),
  MI300: set(),
  V4: set(),
  V5E: {"int8_w8a8"},
  V5P: {"int8_w8a8"},
  V6E: {"int8_w8a8"},
  TPU7X: {"fp8"},
}


@pytest.mark.parametrize("device", list(RUNS_W8A8), ids=lambda d: d.device_kind)
def test_each_device_runs_the_weight_only_schemes_and_its_w8a8_ones(device):
  for name in QUANTIZATION_NAMES:
    runs = name in ("none", "fp8_w8a16", "int8") or name in RUNS_W8A8[device]
    if runs:
      check_device_runs(name, device)
    else:
      with pytest.raises(ValueError, match=rf"^quantization: {name} ") as err:
        check_device_runs(name, device)
      assert "\n" not in str(err.value)


def test_the_refusal_names_the_device_the_units_and_the_alternative():
  assert refusal(SCHEMES["fp8"], A100) == (
    "fp8 (fp8 e4m3 weights, W8A8) needs fp8 tensor cores (NVIDIA compute capability >= 8.9), "
    "which NVIDIA A100-SXM4-80GB (compute capability 8.0) lacks; use fp8_w8a16 (the same "
    "weights, activations unquantized)"
  )
  assert refusal(SCHEMES["fp8"], V5E) == (
    "fp8 (fp8 e4m3 weights, W8A8) needs fp8 matrix units (TPU7x), which TPU v5 lite (v5e) "
    "lacks; use fp8_w8a16 (the same weights, activations unquantized)"
  )
  assert "use int8 (the same weights" in refusal(SCHEMES["int8_w8a8"], V4)
  assert refusal(SCHEMES["fp8"], H100) is None


def test_a_description_of_this_machines_device():
  device = DeviceDescription.of(jax.devices()[0])
  assert device == DeviceDescription("cpu", None, jax.devices()[0].device_kind)
  with pytest.raises(ValueError, match=r"^platform: must be one of"):
    DeviceDescription("metal")


def test_the_engine_refuses_before_loading_anything(monkeypatch):
  """On an A100 (described, as this machine has none), fp8 W8A8 is refused before the
  weights load or the KV pool is allocated; fp8_w8a16 passes the check."""
  monkeypatch.setattr("jaxserve.composition.assembly.DeviceDescription.of", lambda device, *_: A100)
  loaded = []
  monkeypatch.setattr(
    "jaxserve.composition.assembly.load_placement", lambda *a, **k: loaded.append(a) or 1 / 0
  )
  with pytest.raises(ValueError, match=r"^quantization: fp8 .* use fp8_w8a16"):
    build_engine(EngineConfig(quantization="fp8"), show_progress=False)
  assert not loaded
  with pytest.raises(ZeroDivisionError):  # accepted: on to the (stubbed) loader
    build_engine(EngineConfig(quantization="fp8_w8a16"), show_progress=False)
  assert loaded
