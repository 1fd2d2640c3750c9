"""A vLLM `serve` command line for an 8B model, as vLLM's docs write them (quickstart, tool
calling, quantization), is taken by `jaxserve serve` unchanged: every flag parses and maps onto
the configuration it means here (server/vllm_flags.py, engine_args.py). Starting a real server
from such a line is tests/server/test_vllm_serve.py."""

from __future__ import annotations

import logging
import shlex

import pytest

from jaxserve.cli import build_parser
from jaxserve.config_loader import non_default_keys
from jaxserve.server.cli import serve_engine_config

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
  args, unknown = build_parser().parse_known_args(["serve", *words])
  assert unknown == []
  return serve_engine_config(args)


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
  assert server.served_model_name == "llama" and server.tool_call_parser == "llama3_json"
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
