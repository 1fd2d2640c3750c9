"""The `jaxserve` command's conventions: engine flags each set one config key (shown by
`jaxserve config`) and the offline API's keywords the same keys; defaults in every --help;
"did you mean" for a misspelt flag; --version; `serve MODEL`; no TPU-probe noise."""

from __future__ import annotations

import argparse
import importlib
import logging
import subprocess
import sys

import pytest
import yaml

import jaxserve
from jaxserve.cli import build_parser, main
from jaxserve.config import EngineConfig
from jaxserve.config.cli_help import all_parsers
from jaxserve.config.engine_args import ENGINE_ARGS
from jaxserve.entrypoints.llm import engine_config_for
from jaxserve.runtime.log_setup import JAX_BRIDGE_LOGGER, configure_logging

# flag words -> (config key, value the key should hold)
FLAG_VALUES = {
  "model": (["--model", "/ckpt/llama"], "/ckpt/llama"),
  "revision": (["--revision", "v1.0"], "v1.0"),
  "tokenizer": (["--tokenizer", "/ckpt/tok"], "/ckpt/tok"),
  "chat_template": (["--chat-template", "chat.jinja"], "chat.jinja"),
  "generation_config": (["--generation-config", "vllm"], "vllm"),
  "dtype": (["--dtype", "bfloat16"], "bfloat16"),
  "max_model_len": (["--max-model-len", "128"], 128),
  "attention_backend": (["--attention-backend", "xla"], "xla"),
  "gpu_memory_utilization": (["--gpu-memory-utilization", "0.5"], 0.5),
  "block_size": (["--block-size", "32"], 32),
  "max_num_seqs": (["--max-num-seqs", "8"], 8),
  "max_num_batched_tokens": (["--max-num-batched-tokens", "256"], 256),
  "enable_prefix_caching": (["--no-enable-prefix-caching"], False),
  "enable_chunked_prefill": (["--no-enable-chunked-prefill"], False),
  "warmup": (["--warmup", "full"], "full"),
  "compile_threads": (["--compile-threads", "3"], 3),
  "enable_sleep_mode": (["--enable-sleep-mode"], True),
  "scheduling_policy": (["--scheduling-policy", "priority"], "priority"),
  "seed": (["--seed", "7"], 7),
  "tensor_parallel_size": (["--tensor-parallel-size", "2"], 2),
  "data_parallel_size": (["--data-parallel-size", "2"], 2),
  "enable_expert_parallel": (["--enable-expert-parallel"], True),
  "quantization": (["--quantization", "int8"], "int8"),
  "kv_cache_dtype": (["--kv-cache-dtype", "fp8"], "fp8"),
}
# Flags checked on their own (none now: quantized weights shard, so --quantization goes with
# --tensor-parallel-size 2).
ALONE: tuple[str, ...] = ()


def _lookup(tree: dict, key: str) -> object:
  for part in key.split("."):
    tree = tree[part]
  return tree


def test_every_engine_flag_sets_its_key_in_jaxserve_config(capsys):
  assert set(FLAG_VALUES) == {arg.name for arg in ENGINE_ARGS}
  together = [name for name in FLAG_VALUES if name not in ALONE]
  for names in [together] + [[name] for name in ALONE]:
    argv = ["config"] + [word for name in names for word in FLAG_VALUES[name][0]]
    assert main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    for arg in ENGINE_ARGS:
      if arg.name in names:
        assert _lookup(printed, arg.key) == FLAG_VALUES[arg.name][1], arg.flag
  assert (
    main(["config", "--enable-prefix-caching", "--set", "scheduler.enable_prefix_caching=false"])
    == 0
  )
  assert yaml.safe_load(capsys.readouterr().out)["scheduler"]["enable_prefix_caching"] is True


def test_llm_keywords_use_the_same_table():
  values = {name: value for name, (_, value) in FLAG_VALUES.items() if name != "model"}
  together = {name: value for name, value in values.items() if name not in ALONE}
  for given in [together] + [{name: values[name]} for name in ALONE]:
    config = engine_config_for("tiny-random", EngineConfig(), given)
    for arg in ENGINE_ARGS:
      if arg.name != "model" and arg.name not in given:
        continue
      expected = "tiny-random" if arg.name == "model" else given[arg.name]
      node = config
      for part in arg.key.split("."):
        node = getattr(node, part)
      assert node == expected, arg.name
  with pytest.raises(ValueError, match=r"^gpu_memory_utilisation: not an engine argument"):
    engine_config_for("tiny-random", EngineConfig(), {"gpu_memory_utilisation": 0.5})
  with pytest.raises(ValueError, match=r"^cache\.memory_fraction: must be in \(0, 1\]"):
    engine_config_for("tiny-random", EngineConfig(), {"gpu_memory_utilization": 1.5})


def test_every_flag_help_states_its_default():
  for parser in all_parsers(build_parser()):
    formatter = parser._get_formatter()
    for action in parser._actions:
      if not action.option_strings or isinstance(
        action, (argparse._HelpAction, argparse._VersionAction)
      ):
        continue
      assert "default" in formatter._format_action(action), (parser.prog, action.option_strings)


STANDALONE = (
  "batch_invariance",
  "bench_offline",
  "bench_server_startup",
  "bench_startup",
  "bench_structured",
  "random_checkpoint",
  "serve_vs_offline",
  "soak",
)


@pytest.mark.parametrize("module", STANDALONE)
def test_python_m_bench_flags_state_their_defaults(module, monkeypatch):
  """The `python -m jaxserve.bench.<module>` parsers too (their parse_args builds the parser)."""
  parsers = []

  def capture(parser, *args, **kwargs):
    parsers.append(parser)
    raise SystemExit(0)

  monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
  with pytest.raises(SystemExit):
    importlib.import_module(f"jaxserve.bench.{module}").parse_args([])
  (parser,) = parsers
  formatter = parser._get_formatter()
  for action in parser._actions:
    if action.option_strings and not isinstance(action, argparse._HelpAction):
      assert "default" in formatter._format_action(action), (module, action.option_strings)


def test_misspelt_flag_suggests_the_closest(capsys):
  with pytest.raises(SystemExit) as exit_info:
    main(["serve", "--gpu-memory-utilisation", "0.5"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert (
    "jaxserve serve: error: unrecognized arguments: --gpu-memory-utilisation "
    "(did you mean --gpu-memory-utilization?)" in err
  )
  with pytest.raises(SystemExit):
    main(["bench", "serve", "--percentle-metrics=ttft"])
  assert "(did you mean --percentile-metrics?)" in capsys.readouterr().err


def test_version(capsys):
  with pytest.raises(SystemExit) as exit_info:
    main(["--version"])
  assert exit_info.value.code == 0
  assert capsys.readouterr().out.strip() == f"jaxserve {jaxserve.__version__}"


def test_serve_takes_the_model_as_positional_argument(tmp_path):
  def serve(*words: str) -> subprocess.CompletedProcess:
    return subprocess.run(
      [sys.executable, "-m", "jaxserve.cli", "serve", *words],
      capture_output=True,
      text=True,
      timeout=300,
      cwd=tmp_path,
    )

  missing = str(tmp_path / "no-such-checkpoint")
  run = serve(missing, "--port", "0")
  assert run.returncode == 2
  assert run.stderr.strip().endswith(
    f"model: {missing!r} is neither 'tiny-random' nor a checkpoint directory"
  )
  run = serve("tiny-random", "--model", missing)
  assert run.returncode == 2
  assert f"model: given twice, 'tiny-random' and --model {missing!r}" in run.stderr


def test_backend_probe_failures_are_debug_only(caplog):
  configure_logging("INFO")
  bridge = logging.getLogger(JAX_BRIDGE_LOGGER)
  caplog.set_level(logging.INFO)
  bridge.info("Unable to initialize backend 'tpu': no TPU here")
  bridge.warning("a real warning")
  assert "Unable to initialize backend" not in caplog.text and "a real warning" in caplog.text
  caplog.set_level(logging.DEBUG, logger=JAX_BRIDGE_LOGGER)
  bridge.info("Unable to initialize backend 'tpu': no TPU here")
  assert "Unable to initialize backend 'tpu'" in caplog.text


def test_generate_logs_only_actionable_lines(tmp_path):
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "jaxserve.cli",
      "generate",
      "--max-tokens",
      "2",
      "--max-model-len",
      "64",
      "--max-num-seqs",
      "2",
      "--max-num-batched-tokens",
      "16",
      "--set",
      "cache.num_pages=16",
      "--set",
      "scheduler.seq_buckets=[2]",
      "--set",
      "scheduler.token_buckets=[16]",
      "--attention-backend",
      "xla",
    ],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=tmp_path,
  )
  assert run.returncode == 0, run.stderr
  assert "Unable to initialize backend" not in run.stderr
  assert "step XLA options" not in run.stderr
  assert "greedy picks and logprobs: XLA reductions (sampler_backend=xla)" in run.stderr


def test_commands_write_files_only_when_asked(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert main(["kv-plan", "--memory-gb", "0.01", "--avg-seq-len", "64"]) == 0
  assert "paged / contiguous sequences" in capsys.readouterr().out
  assert list(tmp_path.iterdir()) == []
  assert main(["kv-plan", "--memory-gb", "0.01", "--out", "plan.json"]) == 0
  assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
