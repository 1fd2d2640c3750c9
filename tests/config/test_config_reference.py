"""docs/CONFIG.md documents every config key, and `jaxserve config` prints the resolved
configuration as YAML that loads back into the same config."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from jaxserve.cli import main
from jaxserve.config import EngineConfig
from jaxserve.config.loader import NOT_FILE_KEYS, load_config

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md"


def _keys(cls, prefix: str = "") -> list[str]:
  keys = []
  for field in dataclasses.fields(cls):
    if field.name in NOT_FILE_KEYS:  # not a key a config file holds
      continue
    if isinstance(field.default_factory, type) and dataclasses.is_dataclass(field.default_factory):
      keys += _keys(field.default_factory, f"{prefix}{field.name}.")
    else:
      keys.append(prefix + field.name)
  return keys


def test_every_key_is_documented():
  documented = set(re.findall(r"^\| `([\w.]+)` \|", REFERENCE.read_text(), re.MULTILINE))
  keys = set(_keys(EngineConfig))
  assert "scheduler.num_scheduler_steps" in keys and "gpu_gemm" in keys
  assert keys == documented, (keys - documented, documented - keys)


def test_config_command_prints_what_loads_back(tmp_path, capsys):
  overrides = [
    "scheduler.num_scheduler_steps=4",
    "scheduler.seq_buckets=[8, 256]",
    "cache.page_size=32",
  ]
  argv = ["config", "--config", str(REFERENCE.parents[1] / "configs" / "h100.yaml")]
  assert main(argv + [arg for o in overrides for arg in ("--set", o)]) == 0
  printed = yaml.safe_load(capsys.readouterr().out)
  path = tmp_path / "resolved.yaml"
  path.write_text(yaml.safe_dump(printed))
  expected = load_config(REFERENCE.parents[1] / "configs" / "h100.yaml", overrides)
  assert load_config(path) == expected
  assert printed["scheduler"]["num_scheduler_steps"] == 4 and printed["cache"]["page_size"] == 32


def test_config_command_names_a_bad_key(capsys):
  assert main(["config", "--set", "scheduler.max_num_seqs=0"]) == 2
  assert "scheduler.max_num_seqs: must be an integer >= 1" in capsys.readouterr().err
