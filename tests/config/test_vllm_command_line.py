"""A vLLM `serve` command line for an 8B model, as vLLM's docs write them (quickstart, tool
calling, quantization), is taken by `jaxserve serve` unchanged: every flag parses, as `jaxserve`
parses it (cli.parse_command_line), and maps onto the configuration it means here
(config/vllm_flags.py, config/engine_args.py), or is logged once as changing nothing
(inert_args.py). The flags issue 60 saw abort start-up are each taken; token counts read vLLM's
human-readable integers (human_ints.py). Starting a real server from such a line is
tests/server/test_vllm_serve.py."""

from __future__ import annotations

import logging
import shlex

import pytest
from starlette.applications import Starlette

from jaxserve.cli import build_parser, parse_command_line
from jaxserve.config import EngineConfig
from jaxserve.config.cli_args import engine_config_from_args
from jaxserve.config.cli_help import all_parsers
from jaxserve.config.human_ints import human_int
from jaxserve.config.inert_args import UNDEFINED_FLAGS
from jaxserve.config.loader import non_default_keys
from jaxserve.config.serve_flags import serve_engine_config
from jaxserve.entrypoints.llm import engine_config_for
from jaxserve.server.uvicorn_runner import server_config

VLLM_LINE = (
  "vllm serve meta-llama/Llama-3.1-8B-Instruct --host 0.0.0.0 --port 8000 --dtype auto "
  "--api-key token-abc123 --max-model-len 8192 --gpu-memory-utilization 0.9 "
  "--tensor-parallel-size 1 --enable-auto-tool-choice --tool-call-parser llama3_json "
  "--chat-template examples/tool_chat_template_llama3.1_json.jinja --max-logprobs 20 "
  "--disable-log-requests --disable-log-stats --trust-remote-code --quantization fp8 "
  "--kv-cache-dtype fp8 --enable-prefix-caching --served-model-name llama --seed 0 "
  "--max-num-seqs 256 --max-num-batched-tokens 8192 --block-size 16"
)


def _serve_config(words: list[str]):
  return _serve_config_and_notes(words)[0]


def _serve_config_and_notes(words: list[str]):
  args, notes = parse_command_line(["serve", *words])
  return serve_engine_config(args), notes


def test_a_vllm_serve_line_for_an_8b_model_is_taken_unchanged(caplog):
  words = shlex.split(VLLM_LINE)[2:]  # after `vllm serve`
  with caplog.at_level(logging.INFO):
    config = _serve_config(words)
  assert config.model == "meta-llama/Llama-3.1-8B-Instruct"
  assert config.max_model_len == 8192 and config.quantization == "fp8"
  assert config.cache.kv_cache_dtype == "fp8" and config.cache.memory_fraction == 0.9
  assert config.chat_template == "examples/tool_chat_template_llama3.1_json.jinja"
  server = config.server
  assert (server.host, server.port, server.api_key) == ("0.0.0.0", 8000, "token-abc123")
  assert server.served_model_name == ("llama",) and server.tool_call_parser == "llama3_json"
  assert server.max_logprobs == 20 and server.stats_interval_s == 0
  logged = caplog.text
  assert "trust_remote_code: accepted, changes nothing" in logged
  assert "disable_log_requests: accepted, changes nothing" in logged
  assert 'tool_choice "auto" reads tool calls with the llama3_json parser' in logged


def test_vllm_flags_refuse_what_they_cannot_mean():
  with pytest.raises(ValueError, match="^--enable-auto-tool-choice: needs --tool-call-parser"):
    _serve_config(["--enable-auto-tool-choice"])
  with pytest.raises(ValueError, match=r"^server.max_logprobs: must be an integer in \[0, 20\]"):
    _serve_config(["--max-logprobs", "21"])
  assert _serve_config(["--max-logprobs", "5"]).server.max_logprobs == 5


# Issue 60's list: each of these stopped `jaxserve serve` with exit 2 and a usage dump.
ISSUE_60_LINE = (
  "--generation-config auto --served-model-name llama my-llama --max-model-len 1k -tp 2 "
  "--enforce-eager --reasoning-parser deepseek_r1 --disable-uvicorn-access-log "
  "--uvicorn-log-level warning --tokenizer-mode mistral --revision v1.0 "
  "--tool-call-parser hermes"
)


def test_the_flags_issue_60_saw_abort_start_up_are_taken(caplog):
  with caplog.at_level(logging.INFO):
    config, notes = _serve_config_and_notes(shlex.split(ISSUE_60_LINE))
  assert config.max_model_len == 1000 and config.tensor_parallel_size == 2
  assert config.revision == "v1.0"
  server = config.server
  assert server.served_model_name == ("llama", "my-llama")
  assert server.model_names("meta-llama/Llama-3.1-8B-Instruct") == ("llama", "my-llama")
  assert (server.uvicorn_log_level, server.uvicorn_access_log) == ("warning", False)
  assert server.tool_call_parser == "hermes"
  logged = caplog.text  # each flag that changes nothing: one line, once
  for line in (
    "enforce_eager: accepted, changes nothing: JAX compiles every step program ahead of time",
    "tokenizer_mode 'mistral': accepted, changes nothing: jaxserve runs the checkpoint's "
    "tokenizer.json",
  ):
    assert logged.count(line) == 1, logged
  assert config.generation_config == "auto" and server.reasoning_parser == "deepseek_r1"
  assert notes == []  # every flag of the line is defined: none is taken off
  assert _serve_config(["--generation-config=vllm"]).generation_config == "vllm"


def test_the_uvicorn_flags_set_uvicorns_config():
  words = ["--uvicorn-log-level", "debug", "--disable-uvicorn-access-log"]
  uvicorn_config = server_config(Starlette(), _serve_config(words).server, "INFO")
  assert (uvicorn_config.log_level, uvicorn_config.access_log) == ("debug", False)
  uvicorn_config = server_config(Starlette(), _serve_config([]).server, "WARNING")
  assert (uvicorn_config.log_level, uvicorn_config.access_log) == ("warning", True)


def test_no_command_defines_an_undefined_flag():
  """Once a command defines one of them, argparse parses it and its entry is to go."""
  for parser in all_parsers(build_parser()):
    assert not set(UNDEFINED_FLAGS) & set(parser._option_string_actions), parser.prog


@pytest.mark.parametrize(
  "text,value",
  [("8192", 8192), ("1k", 1000), ("32K", 32768), ("1M", 1048576), ("25.6k", 25600)]
  + [("2m", 2_000_000), ("1G", 2**30), (" 4K ", 4096)],
)
def test_human_readable_integers_as_vllm_reads_them(text, value):
  assert human_int(text) == value
  words = ["--max-model-len", text, "--max-num-batched-tokens", text]
  args, _ = parse_command_line(["config", *words])
  config = engine_config_from_args(args)
  assert config.max_model_len == value and config.scheduler.max_num_batched_tokens == value


@pytest.mark.parametrize(
  "text,message",
  [
    ("1.5K", "'1.5K': a decimal number takes a decimal suffix (k/m/g/t, e.g. 25.6k), not 'K'"),
    ("12x", "'12x' is not an integer (suffixes: k/m/g/t decimal, K/M/G/T binary, e.g. 32K)"),
    ("1.5", "'1.5' is not an integer"),
  ],
)
def test_a_bad_length_names_the_flag(text, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    parse_command_line(["serve", "--max-model-len", text])
  assert exit_info.value.code == 2
  assert f"jaxserve serve: error: argument --max-model-len: {message}" in capsys.readouterr().err


def test_vllms_short_aliases():
  words = ["-tp", "2", "-dp", "2", "-q", "int8", "-ep", "-pp", "1"]
  config = _serve_config(words)
  assert (config.tensor_parallel_size, config.data_parallel_size) == (2, 2)
  assert config.quantization == "int8" and config.enable_expert_parallel
  with pytest.raises(ValueError, match=r"^pipeline_parallel_size: must be 1: jaxserve has no"):
    _serve_config(["-pp", "2"])


def test_the_offline_api_takes_the_same_arguments(caplog):
  given = {"enforce_eager": True, "tokenizer_mode": "slow", "revision": "v1.0"}
  with caplog.at_level(logging.INFO):
    config = engine_config_for("tiny-random", EngineConfig(), given)
  assert config.revision == "v1.0"
  assert caplog.text.count("enforce_eager: accepted, changes nothing") == 1
  assert caplog.text.count("tokenizer_mode 'slow': accepted, changes nothing") == 1
  for bad, message in (
    ({"pipeline_parallel_size": 2}, "^pipeline_parallel_size: must be 1"),
    ({"tokenizer_mode": "fast"}, "^tokenizer_mode: must be one of auto, hf, slow, mistral"),
  ):
    with pytest.raises(ValueError, match=message):
      engine_config_for("tiny-random", EngineConfig(), bad)


# vLLM's reasoning-outputs docs: a Qwen3 server with its parser, thinking off by default
REASONING_LINE = (
  "vllm serve Qwen/Qwen3-8B --reasoning-parser qwen3 --generation-config vllm "
  """--default-chat-template-kwargs '{"enable_thinking": false}'"""
)


def test_a_vllm_reasoning_serve_line_is_taken_unchanged():
  config = _serve_config(shlex.split(REASONING_LINE)[2:])
  assert config.generation_config == "vllm" and config.server.reasoning_parser == "qwen3"
  assert config.server.default_chat_template_kwargs == {"enable_thinking": False}
  # a mapping-valued key is a setting like any other (the device-aware defaults read them)
  assert "server.default_chat_template_kwargs.enable_thinking" in non_default_keys(config)
  assert _serve_config([]).generation_config == "auto"
  with pytest.raises(ValueError, match="^--default-chat-template-kwargs: not valid JSON"):
    _serve_config(["--default-chat-template-kwargs", "{enable_thinking: false}"])
  with pytest.raises(ValueError, match="^server.default_chat_template_kwargs: must be null or a"):
    _serve_config(["--default-chat-template-kwargs", "[1]"])
  with pytest.raises(SystemExit):  # argparse's choices
    _serve_config(["--reasoning-parser", "r1"])
