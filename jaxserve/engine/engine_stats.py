"""EngineStats: the engine's counters at one moment (/metrics, /health, the periodic stats line).

A plain frozen dataclass of plain values. It crosses the process boundary whole: the engine core
process ships it in every step message (core/messages.py) and msgspec encodes a dataclass
field by field, so a field added here reaches the API server processes with no IPC change, as
long as its type is one msgspec knows (numbers, strings, tuples, dicts, other dataclasses).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
  num_running: int
  num_waiting: int
  num_used_pages: int
  num_total_pages: int
  num_preemptions: int
  num_compilations: int
  num_programs_compiled: int = 0  # step programs compiled by warmup / the compile thread
  num_programs_total: int = 0  # step programs planned (0: compiled on first use)
  programs_finished_after_s: float = 0.0  # warmup's start to the last program (0: not yet)
  num_prefix_cache_queries: int = 0  # known tokens of admissions that looked the cache up
  num_prefix_cache_hits: int = 0  # tokens of those admissions that cached pages covered
  device_bytes_in_use: int = 0  # the engine's device buffers (weights, KV pool, live steps)
  num_sleeping: int = 0  # 1 while the engine sleeps (engine/sleep_mode.py)
