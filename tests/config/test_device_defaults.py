"""The device-aware defaults (jaxserve/config/device_defaults.py): the rule for several device
descriptions against the settings written out here by hand, explicit settings winning over it, and
the engine running with what it picked (and logging why)."""

from __future__ import annotations

import logging

import pytest

from jaxserve.config import EngineConfig, SchedulerConfig
from jaxserve.config.device_defaults import Usage, apply_device_defaults, device_defaults
from jaxserve.config.loader import load_config
from jaxserve.runtime.device_description import DeviceDescription

GIB = 1 << 30
CPU = DeviceDescription("cpu", None, "cpu")
H100 = DeviceDescription("gpu", "9.0", "NVIDIA H100 80GB HBM3", 80 * GIB)
H200 = DeviceDescription("gpu", "9.0", "NVIDIA H200", 141 * GIB)
L4 = DeviceDescription("gpu", "8.9", "NVIDIA L4", 23 * GIB)
A100_40 = DeviceDescription("gpu", "8.0", "NVIDIA A100-SXM4-40GB", 40 * GIB)
EIGHT_H100 = DeviceDescription("gpu", "9.0", "NVIDIA H100 80GB HBM3", 80 * GIB, 8)
V5E_1 = DeviceDescription("tpu", None, "TPU v5 lite", 16 * GIB)
V6E_8 = DeviceDescription("tpu", None, "TPU v6 lite", 32 * GIB, 8)

SERVE_LARGE = {  # the step budget follows the load: 2,048 tokens, up to 8,192 while few decode
  "scheduler.max_num_seqs": 512,
  "scheduler.max_num_batched_tokens": 8192,
  "scheduler.latency_batched_tokens": 2048,
}
OFFLINE_LARGE = {  # configs/h100-offline.yaml's scheduler
  "scheduler.max_num_seqs": 512,
  "scheduler.max_num_batched_tokens": 8192,
  "scheduler.seq_buckets": (64, 512),
  "scheduler.token_buckets": (512, 2048, 8192),
  "scheduler.num_scheduler_steps": 4,
  "scheduler.prefill_first": True,
  "scheduler.pool_seq_rungs": True,
}
TPU_PAGE = {"cache.page_size": 32}


@pytest.mark.parametrize(
  "device,usage,expected",
  [
    (CPU, Usage.SERVE, {"scheduler.max_num_seqs": 64, "scheduler.max_num_batched_tokens": 512}),
    (CPU, Usage.OFFLINE, {"scheduler.max_num_seqs": 64, "scheduler.max_num_batched_tokens": 512}),
    (H100, Usage.SERVE, SERVE_LARGE),
    (H100, Usage.OFFLINE, OFFLINE_LARGE),
    (H200, Usage.SERVE, SERVE_LARGE),
    (H200, Usage.OFFLINE, OFFLINE_LARGE),
    (EIGHT_H100, Usage.SERVE, SERVE_LARGE),  # per device: tensor parallelism is the user's
    (
      A100_40,
      Usage.SERVE,
      {
        "scheduler.max_num_seqs": 256,
        "scheduler.max_num_batched_tokens": 4096,
        "scheduler.latency_batched_tokens": 1024,
      },
    ),
    (
      L4,
      Usage.SERVE,
      {
        "scheduler.max_num_seqs": 128,
        "scheduler.max_num_batched_tokens": 2048,
        "scheduler.latency_batched_tokens": 512,
      },
    ),
    (
      L4,
      Usage.OFFLINE,
      {
        "scheduler.max_num_seqs": 128,
        "scheduler.max_num_batched_tokens": 2048,
        "scheduler.seq_buckets": (64, 128),
        "scheduler.token_buckets": (128, 512, 2048),
        "scheduler.num_scheduler_steps": 4,
        "scheduler.prefill_first": True,
        "scheduler.pool_seq_rungs": True,
      },
    ),
    (
      V5E_1,  # configs/v5e-1.yaml
      Usage.SERVE,
      TPU_PAGE | {"scheduler.max_num_seqs": 32, "scheduler.max_num_batched_tokens": 512},
    ),
    (
      V6E_8,  # configs/v6e-8.yaml
      Usage.SERVE,
      TPU_PAGE | {"scheduler.max_num_seqs": 256, "scheduler.max_num_batched_tokens": 2048},
    ),
    (
      V6E_8,
      Usage.OFFLINE,
      TPU_PAGE
      | {
        "scheduler.max_num_seqs": 512,
        "scheduler.max_num_batched_tokens": 8192,
        "scheduler.seq_buckets": (64, 512),
        "scheduler.token_buckets": (512, 2048, 8192),
        "scheduler.num_scheduler_steps": 4,
        "scheduler.prefill_first": True,
        "scheduler.pool_seq_rungs": True,
      },
    ),
  ],
)
def test_the_rule_per_device(device, usage, expected):
  choices = device_defaults(device, usage)
  assert {c.key: c.value for c in choices} == expected
  assert all(c.reason for c in choices)
  config, applied = apply_device_defaults(EngineConfig(), device, usage)  # a valid config
  for key, value in expected.items():
    section, name = key.split(".")
    assert getattr(getattr(config, section), name) == value


def test_an_explicit_setting_wins():
  """A key the user set keeps its value, even when it equals the dataclass default; the
  derived buckets step aside for the user's own limits; the other limit never undercuts it."""
  config = load_config(None, ["scheduler.max_num_seqs=64", "cache.page_size=16"])
  assert config.explicit_keys == {"scheduler.max_num_seqs", "cache.page_size"}
  resolved, applied = apply_device_defaults(config, H100, Usage.OFFLINE)
  assert resolved.scheduler.max_num_seqs == 64
  assert resolved.scheduler.max_num_batched_tokens == 8192
  assert resolved.scheduler.seq_buckets is None and resolved.scheduler.token_buckets is None
  assert not resolved.scheduler.pool_seq_rungs  # the ladder of the user's limits stays as it is
  assert resolved.scheduler.num_scheduler_steps == 4
  ladder = load_config(None, ["scheduler.seq_buckets=[64,512]", "scheduler.max_num_seqs=512"])
  assert not apply_device_defaults(ladder, H100, Usage.OFFLINE)[0].scheduler.pool_seq_rungs
  assert "scheduler.max_num_seqs" not in {c.key for c in applied}
  resolved, _ = apply_device_defaults(
    load_config(None, ["scheduler.max_num_batched_tokens=128"]), H100, Usage.SERVE
  )
  assert (resolved.scheduler.max_num_seqs, resolved.scheduler.max_num_batched_tokens) == (128, 128)
  assert resolved.scheduler.latency_batched_tokens is None  # vLLM's flag: a fixed budget
  resolved, applied = apply_device_defaults(
    load_config(None, ["scheduler.max_num_seqs=64"]), H100, Usage.SERVE
  )  # beside the user's sequence limit, the latency budget as a fixed one
  assert (resolved.scheduler.max_num_seqs, resolved.scheduler.max_num_batched_tokens) == (64, 2048)
  assert resolved.scheduler.latency_batched_tokens is None
  assert [(c.key, c.value) for c in applied] == [("scheduler.max_num_batched_tokens", 2048)]
  own = ["scheduler.max_num_seqs=256", "scheduler.latency_batched_tokens=512"]
  resolved, _ = apply_device_defaults(load_config(None, own), H100, Usage.SERVE)
  assert (resolved.scheduler.max_num_batched_tokens, resolved.scheduler.latency_batched_tokens) == (
    8192,
    512,
  )  # the user's own latency budget under the rule's largest step
  tpu, _ = apply_device_defaults(config, V6E_8, Usage.SERVE)
  assert tpu.cache.page_size == 16


def test_a_config_built_in_code_keeps_its_values():
  """Values that differ from EngineConfig()'s count as set, without explicit_keys."""
  config = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64))
  resolved, applied = apply_device_defaults(config, H100, Usage.SERVE)
  assert (resolved.scheduler.max_num_seqs, resolved.scheduler.max_num_batched_tokens) == (8, 64)
  assert applied == ()


def test_explicit_keys_are_not_a_config_file_key():
  with pytest.raises(ValueError, match="explicit_keys: unknown config key"):
    load_config(None, ["explicit_keys=[model]"])


def test_the_engine_runs_with_the_defaults_and_logs_them(caplog):
  """On this CPU: the engine's config holds the rule's CPU values and the log names them."""
  from jaxserve.entrypoints.llm import LLM

  with caplog.at_level(logging.INFO, logger="jaxserve.composition.assembly"):
    llm = LLM("tiny-random", max_model_len=64, show_progress=False, block_size=16)
  assert (llm.config.scheduler.max_num_seqs, llm.config.scheduler.max_num_batched_tokens) == (
    64,
    512,
  )
  logged = [r.getMessage() for r in caplog.records if "defaults for" in r.getMessage()]
  assert len(logged) == 1 and "1 x cpu (cpu), offline" in logged[0]
  assert "scheduler.max_num_seqs=64 (CPU: tests and development)" in logged[0]


def test_the_serve_default_keeps_the_step_programs_few():
  """A large GPU's server compiles 83 step programs: the 72 of 256 sequences / 2,048 tokens (39
  buckets' forwards, 4 sampler modes x 6 sequence rungs, 9 prompt-logprob programs), the 512
  rung's 3 forwards and 4 samplers, and a forward and a prompt-logprob program per wide rung
  (4,096, 8,192); a dense ladder to 8,192 tokens would compile 95."""
  from jaxserve.device.program_groups import program_groups
  from jaxserve.messages.buckets import BucketSet

  def programs(scheduler: SchedulerConfig) -> int:
    return sum(len(g.programs) for g in program_groups(BucketSet.from_config(scheduler), False))

  serve, _ = apply_device_defaults(EngineConfig(), H200, Usage.SERVE)
  assert programs(serve.scheduler) == 83
  assert programs(SchedulerConfig(256, 2048)) == 72
  assert programs(SchedulerConfig(512, 8192)) == 95
