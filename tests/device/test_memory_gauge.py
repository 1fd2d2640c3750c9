"""DeviceMemoryGauge: the engine's device bytes for /metrics, read at most once per interval."""

import jax
import pytest

from jaxserve.device.memory_gauge import DeviceMemoryGauge


class _Device:
  """A device whose memory_stats() answers like a GPU's (the CPU reports none)."""

  def __init__(self, in_use: int):
    self.in_use, self.reads = in_use, 0

  def memory_stats(self):
    self.reads += 1
    return {"bytes_in_use": self.in_use, "bytes_limit": 10 * self.in_use}


def test_sums_the_devices_and_rereads_only_after_the_interval():
  a, b = _Device(100), _Device(23)
  gauge = DeviceMemoryGauge([a, b], interval_s=3600)
  assert gauge.bytes_in_use == 123
  a.in_use = 500
  assert gauge.bytes_in_use == 123 and a.reads == 1  # within the interval: the last reading
  fresh = DeviceMemoryGauge([a, b], interval_s=0)
  assert fresh.bytes_in_use == 523
  a.in_use = 7
  assert fresh.bytes_in_use == 30 and a.reads == 3


def test_a_backend_without_statistics_reads_zero():
  assert DeviceMemoryGauge(jax.devices("cpu")).bytes_in_use == 0


def test_a_negative_interval_is_refused():
  with pytest.raises(ValueError, match="interval_s"):
    DeviceMemoryGauge([], interval_s=-1)
