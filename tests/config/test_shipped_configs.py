"""Every YAML file in configs/ loads into a valid EngineConfig, and CLI-style overrides apply
on top of it (the loader the CLI uses)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxserve.config.loader import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_configs_are_shipped():
  assert {p.name for p in CONFIGS} >= {"h100.yaml", "tiny-random-cpu.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads(path: Path):
  config = load_config(path)
  overridden = load_config(path, ["scheduler.num_scheduler_steps=4", "gpu_gemm=xla"])
  assert overridden.scheduler.num_scheduler_steps == 4 and overridden.gpu_gemm == "xla"
  assert overridden.replace(gpu_gemm=config.gpu_gemm, scheduler=config.scheduler) == config
