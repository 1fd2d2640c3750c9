"""Multi-host serving's settings (`distributed:`): DistributedConfig, validated on construction
(ValueError naming the field); no jax. parallel/multihost.py reads it."""

from __future__ import annotations

from dataclasses import dataclass

from jaxserve.config.require import require as _require
from jaxserve.config.require import require_bool


@dataclass(frozen=True)
class DistributedConfig:
  """Multi-host serving (jax.distributed). Off unless `enabled` or a coordinator_address is set.
  On a Cloud TPU VM, `enabled: true` with the rest null lets JAX detect the slice's hosts.
  Process 0 serves HTTP and schedules; the others run the same steps as workers."""

  enabled: bool = False
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  initialization_timeout_s: int = 300

  def __post_init__(self) -> None:
    require_bool(self.enabled, "distributed.enabled")
    _require(
      self.coordinator_address is None
      or (isinstance(self.coordinator_address, str) and ":" in self.coordinator_address),
      "distributed.coordinator_address",
      f"must be HOST:PORT, got {self.coordinator_address!r}",
    )
    _require(
      self.num_processes is None
      or (isinstance(self.num_processes, int) and self.num_processes >= 1),
      "distributed.num_processes",
      f"must be an integer >= 1, got {self.num_processes!r}",
    )
    _require(
      self.process_id is None
      or (
        isinstance(self.process_id, int)
        and self.process_id >= 0
        and (self.num_processes is None or self.process_id < self.num_processes)
      ),
      "distributed.process_id",
      f"must be in [0, num_processes), got {self.process_id!r}",
    )
    _require(
      isinstance(self.initialization_timeout_s, int) and self.initialization_timeout_s >= 1,
      "distributed.initialization_timeout_s",
      f"must be an integer >= 1, got {self.initialization_timeout_s!r}",
    )

  @property
  def active(self) -> bool:
    return self.enabled or self.coordinator_address is not None
