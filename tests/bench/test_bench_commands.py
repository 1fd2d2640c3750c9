"""The `jaxserve bench` commands beside their `python -m jaxserve.bench.<module>` entry points:
the same flags with the same defaults (one definition, bench/flags.py), JSON written only when
asked by either; `jaxserve bench offline` end to end on tiny-random; random_checkpoint's command
line."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxserve.bench import (
  batch_invariance,
  bench_offline,
  bench_prefix_cache,
  bench_server_startup,
  bench_startup,
  bench_structured,
  random_checkpoint,
  soak,
)
from jaxserve.cli import build_parser, main
from tests.tools.tool_helpers import SMALL_ENGINE_ARGS

REPO = Path(__file__).resolve().parents[2]

# command -> (module, flags the command requires)
COMMANDS = {
  "offline": (bench_offline, []),
  "prefix-cache": (bench_prefix_cache, []),
  "structured": (bench_structured, []),
  "startup": (bench_startup, []),
  "server-startup": (bench_server_startup, ["--model", "m"]),
  "batch-invariance": (batch_invariance, []),
  "soak": (soak, []),
}


@pytest.mark.parametrize("name", COMMANDS)
def test_command_and_module_take_the_same_flags(name):
  module, required = COMMANDS[name]
  command = vars(build_parser().parse_args(["bench", name, *required]))
  assert command.pop("command") == "bench" and command.pop("bench_command") == name
  assert callable(command.pop("func"))
  standalone = vars(module.parse_args(required))
  assert command == standalone
  assert standalone["out"] is None  # no file unless asked, from either entry point


def test_bench_offline_prints_and_writes_only_when_asked(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  argv = [
    "bench",
    "offline",
    *SMALL_ENGINE_ARGS,
    "--num-prompts",
    "4",
    "--input-len",
    "8",
    "--output-len",
    "4",
  ]
  assert main(argv) == 0
  assert "output tokens/s" in capsys.readouterr().out
  assert list(tmp_path.iterdir()) == []
  assert main(argv + ["--out", "offline.json"]) == 0
  assert [p.name for p in tmp_path.iterdir()] == ["offline.json"]
  result = json.loads((tmp_path / "offline.json").read_text())
  assert result["output_tokens_per_s"] > 0 and result["compilations_after_warmup"] == 0
  assert (result["kv_pool_pages"], result["kv_pool_tokens"]) == (255, 255 * 16)  # 256, less page 0
  empty = hashlib.sha256(b"").hexdigest()[:16]  # a request whose tokens were not collected
  assert len(result["token_digests"]) == 4 and empty not in result["token_digests"]


def test_bench_offline_module_fails_with_one_line_and_a_nonzero_exit(tmp_path, capsys):
  """`python -m jaxserve.bench.bench_offline`: a refused run is one line on stderr, exit 2 (a
  traceback or exit 0 without a table read as a result)."""
  argv = [*SMALL_ENGINE_ARGS, "--num-prompts", "2", "--input-len", "16", "--output-len", "8"]
  code = bench_offline.main(argv + ["--max-model-len", "8", "--out", str(tmp_path / "o.json")])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and err[-1].startswith("bench_offline: error: prompt: 16 prompt tokens")
  assert not (tmp_path / "o.json").exists()


def test_random_checkpoint_module_is_a_command(capsys):
  """`python -m jaxserve.bench.random_checkpoint` without arguments is a usage error, not a
  silent no-op; --help lists the shapes."""
  run = subprocess.run(
    [sys.executable, "-m", "jaxserve.bench.random_checkpoint"],
    capture_output=True,
    text=True,
    timeout=60,
    cwd=REPO,
  )
  assert run.returncode == 2 and "required: shape, out_dir" in run.stderr, run.stderr
  with pytest.raises(SystemExit):
    random_checkpoint.parse_args(["--help"])
  help_text = capsys.readouterr().out
  assert "llama-3.1-8b" in help_text and "(default: 0)" in help_text


def test_bench_prefix_cache_computes_the_shared_prompt_once_with_caching_on(tmp_path, capsys):
  """8 prompts of 32 shared + 8 own tokens (pages of 16), all at once: with caching on the first
  computes its 40 tokens and the other 7 hit the 2 shared pages and compute their 8; off, all
  320 are computed. Each mode runs in its own process (--caching both)."""
  out = tmp_path / "prefix.json"
  argv = [
    "bench",
    "prefix-cache",
    *SMALL_ENGINE_ARGS,
    "--warmup",
    "lazy",
    "--num-prompts",
    "8",
    "--prefix-len",
    "32",
    "--suffix-len",
    "8",
    "--output-len",
    "2",
    "--out",
    str(out),
  ]
  assert main(argv) == 0
  assert "on / off" in capsys.readouterr().out
  runs = json.loads(out.read_text())["runs"]
  on, off = runs["on"], runs["off"]
  assert (on["prompt_tokens"], on["hit_tokens"], on["prefill_tokens"]) == (320, 7 * 32, 96)
  assert (off["prompt_tokens"], off["hit_tokens"], off["prefill_tokens"]) == (320, 0, 320)
  assert on["output_tokens"] == off["output_tokens"] == 16
