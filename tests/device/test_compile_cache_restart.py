"""A restart with a warm compilation cache compiles nothing (counted, not timed): the engine's
own cache settings (assembly.enable_compilation_cache) put every program in the cache and every
step program in the program store beside it, so a second process building the same engine reads
the step programs from the store and the rest (what a step compiles besides them) from XLA's
cache, with warmup "full" or with the server's "background" compile thread (whose programs are
the very ones the full warmup compiles)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
sys.path.insert(0, {repo!r})
from jaxserve.composition.assembly import build_engine
from jaxserve.config.loader import load_config
config = load_config(None, ["compilation_cache_dir={cache}", "max_model_len=64",
                            "scheduler.max_num_seqs=8", "scheduler.max_num_batched_tokens=32",
                            "scheduler.seq_buckets=[8]", "scheduler.token_buckets=[16,32]",
                            "warmup={warmup}"])
engine = build_engine(config, show_progress=False)
if {warmup!r} == "background":
  assert engine.programs.wait(timeout=600)
ledger = engine.ledger
print(json.dumps({{"hits": ledger.cache_hits, "misses": ledger.cache_misses,
                  "stored": engine.programs.num_loaded}}))
"""


def _without_test_cache(environ) -> dict:
  """The environment without tests/conftest.py's shared cache (the engine's own must be used)."""
  return {
    k: v
    for k, v in environ.items()
    if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))
  }


def _build(cache: Path, warmup: str = "full") -> dict:
  code = BUILD.format(repo=str(REPO), cache=str(cache), warmup=warmup)
  done = subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    timeout=300,
    env={**_without_test_cache(os.environ), "JAX_PLATFORMS": "cpu"},
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "loaded from the compilation cache" in done.stderr
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_warm_restart_compiles_nothing(tmp_path):
  cache = tmp_path / "xla-cache"
  cold = _build(cache)
  assert cold["misses"] > 10 and cold["hits"] == 0  # every program, fast ones too, compiled
  warm = _build(cache)
  assert warm["misses"] == 0
  # every step program from the program store, what else a step compiles from XLA's cache
  assert warm["stored"] > 0 and warm["hits"] + warm["stored"] == cold["misses"]
  # the server's default: the largest bucket first, the rest on the compile thread
  background = _build(cache, "background")
  assert background["misses"] == 0
  assert background["stored"] == warm["stored"] and background["hits"] == warm["hits"]
