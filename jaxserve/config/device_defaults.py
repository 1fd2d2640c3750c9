"""Device-aware defaults: the one rule that picks the scheduler settings a user did not set, from
the devices the engine runs on and what it is for.

`device_defaults(device, usage)` maps a `DeviceDescription` (platform, device kind, memory per
device, device count) and a `Usage` (a server that streams to clients, or an offline batch of
`LLM.generate` / `jaxserve bench`) to `Choice`s: a dotted config key, its value and the reason,
which the start-up log prints. `apply_device_defaults` applies them to an EngineConfig, except
the keys the user set (`EngineConfig.explicit_keys`: a config file, `--set`, a flag, an `LLM`
keyword; and any value that differs from EngineConfig()'s, as a config built in code sets
it): an explicit setting always wins. When the user set either scheduler limit, the
derived bucket ladders and latency budget are left out (the user's limits define them: a
`--max-num-batched-tokens N` of vLLM's is a fixed budget of N tokens a step; beside the user's
max_num_seqs alone, the step budget is the latency budget, fixed), and the derived limits never
undercut the other, user-set one; a ladder the user set or derived from the user's limits gets
no pool rungs.

The rule, per class of device:
  - large GPUs (at least 70 GiB: H100, H200, A100 80 GB, B200): serving at 512 sequences with a
    step budget that follows the load (scheduler.latency_batched_tokens; engine/step_budget.py):
    2,048 tokens a step once many requests decode, up to 8,192 while few do and the prompts at
    hand fill the larger step (continuous batching that keeps decodes running while prompts
    arrive); offline at 512 sequences and 8,192 tokens with prefill-first steps, decode bursts
    of 4 and sparse bucket ladders (the settings measured best on an H100,
    docs/PERFORMANCE.md), with sequence rungs added where the KV pool bounds the batch
    (scheduler.pool_seq_rungs);
  - smaller GPUs: half of that per halving of memory class (24-70 GiB, below 24 GiB);
  - TPUs: 32-row pages (what the Pallas TPU kernel reads in every KV dtype) and limits that
    grow with the slice's HBM (a v5e chip's 16 GiB serves 32 sequences, a v6e-8 256);
  - CPU: the conservative limits of tests and development (64 sequences, 512 tokens).
A server keeps every step's tokens flowing (no prefill-first, no bursts); an offline batch
trades inter-token latency for throughput. Everything else keeps its config default.

This module imports nothing from jax: the caller describes the devices
(jaxserve/runtime/device_description.py; device/device_memory.describe_devices for this process's).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from jaxserve.config import CacheConfig, EngineConfig, SchedulerConfig
from jaxserve.config.loader import non_default_keys
from jaxserve.runtime.device_description import DeviceDescription

GIB = 1 << 30
LARGE_GPU_BYTES = 70 * GIB
MEDIUM_GPU_BYTES = 24 * GIB


class Usage(str, enum.Enum):
  SERVE = "serve"  # an HTTP server streaming every token (jaxserve serve)
  OFFLINE = "offline"  # a batch run to completion (LLM.generate, jaxserve bench)


@dataclass(frozen=True)
class Choice:
  key: str  # a dotted config key, e.g. "scheduler.max_num_seqs"
  value: object
  reason: str


def _limits(seqs: int, tokens: int, reason: str) -> list[Choice]:
  return [
    Choice("scheduler.max_num_seqs", seqs, reason),
    Choice("scheduler.max_num_batched_tokens", tokens, reason),
  ]


def _serve(seqs: int, tokens: int, latency: int, reason: str) -> list[Choice]:
  """A server: `latency` tokens a step once many requests decode, up to `tokens` while few do."""
  follows = f"{reason}: the step budget while many requests decode, up to {tokens} while few do"
  return _limits(seqs, tokens, reason) + [
    Choice("scheduler.latency_batched_tokens", latency, follows)
  ]


def _offline(seqs: int, tokens: int, reason: str) -> list[Choice]:
  """An offline batch: prefill-first steps, decode bursts of 4 and three token buckets."""
  return _limits(seqs, tokens, reason) + [
    Choice("scheduler.seq_buckets", tuple(sorted({min(64, seqs), seqs})), reason),
    Choice("scheduler.token_buckets", (tokens // 16, tokens // 4, tokens), reason),
    Choice("scheduler.num_scheduler_steps", 4, "offline: decode bursts of 4 steps a dispatch"),
    Choice("scheduler.prefill_first", True, "offline: admit prompts before decoding"),
    Choice("scheduler.pool_seq_rungs", True, "offline: rungs where the KV pool bounds the batch"),
  ]


def _gpu(device: DeviceDescription, usage: Usage) -> list[Choice]:
  memory = device.memory_bytes
  if memory >= LARGE_GPU_BYTES:
    scale, size = 1, "a GPU of >= 70 GiB"
  elif memory >= MEDIUM_GPU_BYTES:
    scale, size = 2, "a GPU of 24-70 GiB"
  else:
    scale, size = 4, "a GPU below 24 GiB (or of unknown memory)"
  if usage is Usage.SERVE:
    return _serve(512 // scale, 8192 // scale, 2048 // scale, f"serving on {size}")
  return _offline(512 // scale, 8192 // scale, f"offline on {size}")


def _tpu(device: DeviceDescription, usage: Usage) -> list[Choice]:
  hbm_gib = device.memory_bytes * device.device_count / GIB
  # 32 sequences per 16 GiB of HBM (a v5e chip) and 512 tokens per 32 GiB, up to 256 / 2,048
  units = max(1, min(8, int(hbm_gib // 16)))
  seqs, tokens = 32 * units, 512 * max(1, units // 2)
  reason = f"{hbm_gib:.0f} GiB of TPU HBM"
  page = [Choice("cache.page_size", 32, "TPU: the Pallas TPU kernel's page of every KV dtype")]
  if usage is Usage.SERVE:
    return page + _limits(seqs, tokens, f"serving on {reason}")
  return page + _offline(2 * seqs, 4 * tokens, f"offline on {reason}")


def device_defaults(device: DeviceDescription, usage: Usage) -> tuple[Choice, ...]:
  """The settings the rule picks for `device` and `usage` (module docstring)."""
  if device.platform == "gpu":
    return tuple(_gpu(device, usage))
  if device.platform == "tpu":
    return tuple(_tpu(device, usage))
  return tuple(_limits(64, 512, "CPU: tests and development"))


def apply_device_defaults(
  config: EngineConfig, device: DeviceDescription, usage: Usage
) -> tuple[EngineConfig, tuple[Choice, ...]]:
  """`config` with the rule's choices for every key the user did not set, and those choices."""
  explicit = non_default_keys(config)  # config.explicit_keys and every value set in code
  limits = {"scheduler.max_num_seqs", "scheduler.max_num_batched_tokens"}
  user_limits = bool(limits & explicit)
  derived = ("_buckets", "latency_batched_tokens")  # what the user's limits define instead
  user_ladder = user_limits or "scheduler.seq_buckets" in explicit  # kept as the user gave it
  applied = [
    c
    for c in device_defaults(device, usage)
    if c.key not in explicit
    and not (user_limits and c.key.endswith(derived))
    and not (user_ladder and c.key == "scheduler.pool_seq_rungs")
  ]
  sections = {"scheduler": config.scheduler, "cache": config.cache}
  changes: dict[str, dict[str, object]] = {"scheduler": {}, "cache": {}}
  for choice in applied:
    section, name = choice.key.split(".")
    changes[section][name] = choice.value
  scheduler = changes["scheduler"]
  latency = [c.value for c in device_defaults(device, usage) if c.key.endswith(derived[1])]
  own_latency = "scheduler.latency_batched_tokens" in explicit
  if user_limits and latency and "max_num_batched_tokens" in scheduler and not own_latency:
    scheduler["max_num_batched_tokens"] = latency[0]  # a fixed budget beside the user's limit
  if user_limits:  # never undercut the user's own limit
    seqs = scheduler.get("max_num_seqs", sections["scheduler"].max_num_seqs)
    tokens = scheduler.get("max_num_batched_tokens", sections["scheduler"].max_num_batched_tokens)
    if "max_num_batched_tokens" in scheduler:
      scheduler["max_num_batched_tokens"] = max(tokens, seqs)
    if "max_num_seqs" in scheduler:
      scheduler["max_num_seqs"] = min(seqs, tokens)
  scheduler_config: SchedulerConfig = dataclasses.replace(sections["scheduler"], **scheduler)
  cache_config: CacheConfig = dataclasses.replace(sections["cache"], **changes["cache"])
  chosen = tuple(
    dataclasses.replace(c, value=changes[c.key.split(".")[0]][c.key.split(".")[1]]) for c in applied
  )
  return config.replace(scheduler=scheduler_config, cache=cache_config), chosen
