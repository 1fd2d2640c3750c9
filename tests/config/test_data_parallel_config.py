"""data_parallel_size: validated (naming the key), set by vLLM's --data-parallel-size flag and
the LLM keyword, and refused where one engine runs (offline, one process, multi-host)."""

from __future__ import annotations

import pytest

from jaxserve.cli import build_parser
from jaxserve.config import DistributedConfig, EngineConfig, ServerConfig
from jaxserve.config.cli_args import engine_config_from_args
from jaxserve.entrypoints.llm import LLM


def test_the_vllm_flag_sets_the_key():
  args = build_parser().parse_args(["serve", "--data-parallel-size", "2"])
  config = engine_config_from_args(args)
  assert config.data_parallel_size == 2 and "data_parallel_size" in config.explicit_keys


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_a_bad_value_names_the_key(value):
  with pytest.raises(ValueError, match="^data_parallel_size: must be an integer >= 1"):
    EngineConfig(data_parallel_size=value)


def test_it_needs_api_server_processes_and_one_host():
  with pytest.raises(ValueError, match="^data_parallel_size: .*api_server_count 0"):
    EngineConfig(data_parallel_size=2, server=ServerConfig(api_server_count=0))
  with pytest.raises(ValueError, match="^data_parallel_size: .*multi-host"):
    EngineConfig(data_parallel_size=2, distributed=DistributedConfig(enabled=True))


def test_the_offline_engine_refuses_it():
  with pytest.raises(ValueError, match="^data_parallel_size: 2 engine cores run under"):
    LLM("tiny-random", data_parallel_size=2)
