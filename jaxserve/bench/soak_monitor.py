"""What `jaxserve bench soak` watches besides its own calls: the server's /metrics and, when the
server runs on this machine (Linux), its processes.

`scrape` reads the Prometheus text into {sample name: value} (unlabelled samples). The server's
processes are found from its port in /proc: the API server processes are those holding the
listening socket that multiprocessing spawned (`api_server_pids`; the supervisor holds it too),
their parent is the supervisor, whose children are the engine core and the API servers
(`server_pids`); `rss_bytes` sums their resident memory. `kill_api_server` is the soak's
fault: SIGKILL to the oldest API server process (the supervisor restarts it). Elsewhere (another
host, another OS) these come back empty and the soak reports what /metrics says.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx

PROC = Path("/proc")


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
  """/metrics as {name: value}, unlabelled samples only ({} when it does not answer)."""
  try:
    response = await client.get("/metrics", timeout=10)
  except httpx.HTTPError:
    return {}
  if response.status_code != 200:
    return {}
  values = {}
  for line in response.text.splitlines():
    if line.startswith("#") or "{" in line or " " not in line:
      continue
    name, _, value = line.partition(" ")
    try:
      values[name] = float(value.split()[0])
    except ValueError:
      pass
  return values


def _listening_inodes(port: int) -> set[str]:
  inodes = set()
  for table in ("tcp", "tcp6"):
    path = PROC / "net" / table
    if not path.exists():
      continue
    for row in path.read_text().splitlines()[1:]:
      fields = row.split()
      if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
        inodes.add(fields[9])
  return inodes


def _holds(pid: int, inodes: set[str]) -> bool:
  try:
    for fd in os.listdir(PROC / str(pid) / "fd"):
      try:
        target = os.readlink(PROC / str(pid) / "fd" / fd)
      except OSError:
        continue
      if target.startswith("socket:[") and target[8:-1] in inodes:
        return True
  except OSError:
    pass
  return False


def _pids() -> list[int]:
  return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()] if PROC.exists() else []


def _cmdline(pid: int) -> str:
  try:
    return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return ""


def _parent(pid: int) -> int | None:
  try:
    stat = (PROC / str(pid) / "stat").read_text()
  except OSError:
    return None
  return int(stat.rsplit(")", 1)[1].split()[1])


def api_server_pids(port: int) -> list[int]:
  """The API server processes serving `port` on this machine (sorted)."""
  inodes = _listening_inodes(port)
  if not inodes:
    return []
  holders = [pid for pid in _pids() if _holds(pid, inodes)]
  return sorted(pid for pid in holders if "multiprocessing" in _cmdline(pid))


def server_pids(port: int) -> list[int]:
  """The supervisor and all its children (engine core, API servers); the one process of a
  one-process server."""
  apis = api_server_pids(port)
  if apis:
    supervisor = _parent(apis[0])
    return sorted({supervisor, *(p for p in _pids() if _parent(p) == supervisor)} - {None})
  inodes = _listening_inodes(port)
  return sorted(pid for pid in _pids() if inodes and _holds(pid, inodes))


def rss_bytes(pids: list[int]) -> int:
  total = 0
  for pid in pids:
    try:
      for line in (PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
          total += int(line.split()[1]) * 1024
    except OSError:
      pass
  return total


def _start_ticks(pid: int) -> int:
  try:
    return int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return 0


def kill_api_server(port: int) -> int | None:
  """SIGKILL to the API server process that has run longest (so the kills go round the
  processes, restarted ones last); its pid, None if none was found."""
  pids = api_server_pids(port)
  if not pids:
    return None
  victim = min(pids, key=_start_ticks)
  try:
    os.kill(victim, signal.SIGKILL)
  except ProcessLookupError:
    return None
  return victim
