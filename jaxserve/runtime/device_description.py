"""A description of the devices an engine runs on, as plain data (no jax): what the rules that
depend on the device read (quantization/capabilities.py: which schemes run;
config/device_defaults.py: the scheduler settings a user did not set). The caller builds it from
jax's Device (`DeviceDescription.of`) or, for a target it does not have (compile-tpu), from a
topology.
"""

from __future__ import annotations

from dataclasses import dataclass

PLATFORMS = ("cpu", "gpu", "tpu")
# jax Device.device_kind of each TPU chip -> its name in Cloud TPU's terms
TPU_CHIPS = {
  "TPU v4": "v4",
  "TPU v5 lite": "v5e",
  "TPU v5": "v5p",
  "TPU v6 lite": "v6e",
  "TPU7x": "TPU7x",
}


@dataclass(frozen=True)
class DeviceDescription:
  """The devices an engine runs on: the platform ("cpu", "gpu", "tpu"), a GPU's compute
  capability (NVIDIA "9.0"; None elsewhere), the device kind jax reports ("TPU v5 lite",
  "NVIDIA H100 80GB HBM3"), memory per device in bytes (0: unknown) and how many."""

  platform: str
  compute_capability: str | None = None
  device_kind: str = ""
  memory_bytes: int = 0
  device_count: int = 1

  def __post_init__(self) -> None:
    if self.platform not in PLATFORMS:
      raise ValueError(f"platform: must be one of {PLATFORMS}, got {self.platform!r}")
    if not isinstance(self.memory_bytes, int) or self.memory_bytes < 0:
      raise ValueError(f"memory_bytes: must be an integer >= 0, got {self.memory_bytes!r}")
    if not isinstance(self.device_count, int) or self.device_count < 1:
      raise ValueError(f"device_count: must be an integer >= 1, got {self.device_count!r}")

  @classmethod
  def of(cls, device, memory_bytes: int = 0, device_count: int = 1) -> DeviceDescription:
    """The description of a jax Device (read by attribute: this module imports no jax)."""
    platform = {"cuda": "gpu", "rocm": "gpu"}.get(device.platform, device.platform)
    capability = getattr(device, "compute_capability", None)
    capability = None if capability is None else str(capability)
    return cls(platform, capability, device.device_kind, memory_bytes, device_count)

  def nvidia_capability(self) -> tuple[int, int] | None:
    """(major, minor) of an NVIDIA GPU; None for any other device."""
    if self.platform != "gpu" or self.compute_capability is None:
      return None
    major, _, minor = self.compute_capability.partition(".")
    if not (major.isdigit() and minor.isdigit()):
      return None
    return int(major), int(minor)

  def name(self) -> str:
    if self.platform == "tpu":
      chip = TPU_CHIPS.get(self.device_kind)
      return (
        f"{self.device_kind} ({chip})" if chip and chip != self.device_kind else self.device_kind
      )
    if self.platform == "gpu":
      return f"{self.device_kind or 'GPU'} (compute capability {self.compute_capability})"
    return self.device_kind or self.platform

  def describe(self) -> str:
    """e.g. "1 x NVIDIA H100 80GB HBM3 (gpu, 80 GiB)"."""
    memory = f", {self.memory_bytes / 2**30:.0f} GiB" if self.memory_bytes else ""
    return f"{self.device_count} x {self.device_kind or self.platform} ({self.platform}{memory})"
