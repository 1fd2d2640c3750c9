"""CPU time of a `jaxserve serve` process tree, per process, over a benchmark run (Linux /proc).

The supervisor (`jaxserve serve`) starts the engine core process first and then the API server
processes, so its children in start order are: core, api-0, api-1, ... (multiprocessing's
resource tracker, if any, is recognized by its command line and left out). A process's CPU time
counts all its threads (utime + stime from /proc/PID/stat), so a busy JAX process can exceed one
core. Used by serve_vs_offline to say how busy each process is; returns {}
where /proc is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
  """Fields of /proc/PID/stat after the command name (field 3 onwards), or None if gone."""
  try:
    text = Path(f"/proc/{pid}/stat").read_text()
  except OSError:
    return None
  return text[text.rindex(")") + 2 :].split()


def children(pid: int) -> list[int]:
  """The live children of pid, oldest first."""
  found = []
  for entry in Path("/proc").iterdir():
    if entry.name.isdigit():
      fields = _stat(int(entry.name))
      if fields is not None and int(fields[1]) == pid:  # field 4: ppid
        found.append((int(fields[19]), int(entry.name)))  # field 22: start time
  return [child for _, child in sorted(found)]


def _is_helper(pid: int) -> bool:
  try:
    return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
  except OSError:
    return True


def server_pids(supervisor: int) -> list[int]:
  """The supervisor and its children that serve (the engine core, the API servers), without
  multiprocessing's resource tracker."""
  return [supervisor] + [pid for pid in children(supervisor) if not _is_helper(pid)]


def server_processes(supervisor: int, api_servers: int) -> dict[str, int]:
  """Role -> pid: 'supervisor', and for a multi-process server (api_servers > 0) 'core' and
  'api-0' .. 'api-{api_servers - 1}' (a single-process server is the supervisor alone)."""
  roles = {"supervisor": supervisor}
  if api_servers > 0:
    found = server_pids(supervisor)[1:]
    # a server still starting has fewer children than roles: those found so far
    roles.update(zip(["core"] + [f"api-{k}" for k in range(api_servers)], found, strict=False))
  return roles


def cpu_seconds(roles: dict[str, int]) -> dict[str, float]:
  """Role -> CPU seconds used so far (user + system, all threads); gone processes omitted."""
  seconds = {}
  for role, pid in roles.items():
    fields = _stat(pid)
    if fields is not None:
      seconds[role] = (int(fields[11]) + int(fields[12])) / _TICKS  # fields 14, 15
  return seconds


class CpuMeter:
  """CPU used by each process of a server tree between start() and stop(), in cores."""

  def __init__(self, supervisor: int, api_servers: int):
    self._roles = server_processes(supervisor, api_servers) if Path("/proc").is_dir() else {}
    self._before: dict[str, float] = {}

  def start(self) -> None:
    self._before = cpu_seconds(self._roles)

  def stop(self, wall_seconds: float) -> dict[str, float]:
    after = cpu_seconds(self._roles)
    return {
      role: (after[role] - self._before[role]) / wall_seconds
      for role in after
      if role in self._before and wall_seconds > 0
    }
