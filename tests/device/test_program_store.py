"""The program store (device/program_store.py): a restart with the same engine reads every step
program back without tracing, lowering or compiling one, and serves the same tokens; what a
program depends on (the engine's config, the code, the environment) changes where it is looked
up; a damaged file is a miss that compiles the program again; old fingerprints are pruned."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.composition.assembly import open_program_store
from jaxserve.device.program_groups import Program
from jaxserve.device.program_lowering import ProgramLowering
from jaxserve.device.program_store import (
  KEEP,
  SUFFIX,
  ProgramStore,
  environment_description,
  source_digest,
)
from jaxserve.device.sampler import SamplerMode
from jaxserve.messages.buckets import Bucket
from tests.integration.engine_helpers import run_to_completion, small_engine

CONFIG = dict(
  num_pages=64,
  max_num_seqs=4,
  seq_buckets=(4,),
  token_buckets=(8, 32),
  max_tokens_per_step=32,
  max_model_len=128,
)


def _serve(engine) -> dict[str, tuple]:
  """Greedy tokens, their logprobs and one request's prompt logprobs (every program kind)."""
  for i in range(3):
    params = SamplingParams(
      max_tokens=8, ignore_eos=True, logprobs=1, prompt_logprobs=1 if i == 0 else None
    )
    engine.add_request(list(range(1, 6 + 5 * i)), params, str(i))
  done = run_to_completion(engine)
  return {rid: (out.token_ids, out.logprobs, out.prompt_logprobs) for rid, out in done.items()}


def test_a_restart_reads_every_program_from_the_store(tmp_path: Path):
  cache = str(tmp_path / "cache")
  first = small_engine(warmup="full", compile_threads=2, compilation_cache_dir=cache, **CONFIG)
  assert first.programs.num_loaded == 0 and first.programs.lowering_s > 0
  served = _serve(first)
  first.ledger.close()
  stores = list((tmp_path / "cache" / "jaxserve-programs").iterdir())
  assert len(stores) == 1 and len(list(stores[0].glob(f"*{SUFFIX}"))) == first.programs.num_total

  again = small_engine(warmup="full", compile_threads=2, compilation_cache_dir=cache, **CONFIG)
  compiler = again.programs
  assert compiler.num_loaded == compiler.num_total and compiler.lowering_s == 0.0
  misses = again.ledger.cache_misses
  assert _serve(again) == served
  assert again.ledger.cache_misses == misses  # serving compiled nothing either
  again.ledger.close()

  config, model_config = again.config, again.runner.model.config
  assert open_program_store(config, model_config).directory == stores[0]
  elsewhere = dataclasses.replace(  # not what a program depends on
    config,
    compile_threads=3,
    warmup="background",
    server=dataclasses.replace(config.server, port=1234),
    explicit_keys=frozenset({"server.port"}),
  )
  assert open_program_store(elsewhere, model_config).directory == stores[0]
  shorter = dataclasses.replace(config, max_model_len=96)
  assert open_program_store(shorter, model_config).directory != stores[0]


def test_a_program_from_xlas_cache_is_not_stored_again(tmp_path: Path):
  """A program the persistent compilation cache gave back is not serialized again into the store
  (an executable read back from a cache does not always serialize whole): with the store's
  folder removed and XLA's cache warm, a restart stores nothing and reads nothing from the store."""
  cache = tmp_path / "cache"
  first = small_engine(warmup="full", compilation_cache_dir=str(cache), **CONFIG)
  first.ledger.close()
  (store,) = (cache / "jaxserve-programs").iterdir()
  shutil.rmtree(store)
  again = small_engine(warmup="full", compilation_cache_dir=str(cache), **CONFIG)
  assert again.ledger.cache_misses == 0 and again.programs.num_loaded == 0
  assert list(store.glob(f"*{SUFFIX}")) == []
  again.ledger.close()


def _double(x):
  return x * 2


def test_a_damaged_file_is_a_miss_and_is_removed(tmp_path: Path, caplog):
  store = ProgramStore.open(tmp_path, "engine")
  args = (jax.ShapeDtypeStruct((3,), jnp.float32),)
  assert store.load("double", args) is None  # absent
  compiled = jax.jit(_double).lower(*args).compile()
  store.save("double", args, compiled)
  loaded = store.load("double", args)
  assert loaded is not None and loaded(jnp.ones(3)).tolist() == [2.0, 2.0, 2.0]
  other_args = (jax.ShapeDtypeStruct((4,), jnp.float32),)
  assert store.load("double", other_args) is None  # keyed by the arguments' shapes too
  store.path("double", args).write_bytes(b"not an executable")
  with caplog.at_level(logging.WARNING, logger="jaxserve.device.program_store"):
    assert store.load("double", args) is None
  assert "double did not load" in caplog.text
  assert not store.path("double", args).exists()


def test_the_fingerprint_follows_code_environment_and_engine(tmp_path: Path):
  package = tmp_path / "pkg"
  package.mkdir()
  (package / "a.py").write_text("x = 1\n")
  before = source_digest(package)
  (package / "__pycache__").mkdir()
  (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
  assert source_digest(package) == before  # compiled bytecode is not the code
  (package / "a.py").write_text("x = 2\n")
  assert source_digest(package) != before
  env = {"HOME": "/root", "XLA_FLAGS": "--xla_a", "JAXSERVE_X": "1"}
  assert environment_description(env) == environment_description({**env, "HOME": "/x"})
  assert environment_description(env) != environment_description({**env, "XLA_FLAGS": "--b"})
  root = tmp_path / "store"
  assert ProgramStore.open(root, "a").directory == ProgramStore.open(root, "a").directory
  assert ProgramStore.open(root, "a").directory != ProgramStore.open(root, "b").directory


def test_only_the_most_recently_used_fingerprints_are_kept(tmp_path: Path):
  directories = []
  for i in range(KEEP + 2):
    directories.append(ProgramStore.open(tmp_path, f"engine {i}").directory)
    os.utime(directories[-1], (i, i))  # opened in this order, long ago
  ProgramStore.open(tmp_path, "engine 0")  # used again: now the newest
  kept = {p.name for p in tmp_path.iterdir()}
  assert len(kept) == KEEP and directories[0].name in kept
  assert directories[1].name not in kept and directories[-1].name in kept


def test_an_installed_program_runs_instead_of_the_jitted_one():
  """The runner calls the executable installed for a program's key: here a greedy sampler that
  answers token 7 everywhere, so the tokens show which ran."""
  engine = small_engine(warmup="lazy", **CONFIG)
  runner = engine.runner
  greedy = Program("sample", Bucket(4, 8), SamplerMode())
  jitted, args, static = ProgramLowering(runner).arguments(greedy)

  def sevens(logits, sampling, previous):
    out, padded = jitted(logits, sampling, previous, *static)
    return dataclasses.replace(out, token_ids=jnp.full_like(out.token_ids, 7)), padded

  runner.install(greedy.key, jax.jit(sevens).lower(*args).compile())
  engine.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=3), "a")
  assert run_to_completion(engine)["a"].token_ids == (7, 7, 7)
  engine.ledger.close()


def test_background_saves_wait_until_the_engine_is_idle(tmp_path: Path, monkeypatch, caplog):
  """In the background, compiled programs are written to the store only once the engine has had
  no request to serve for IDLE_BEFORE_SAVE_S (serializing holds the GIL): none while a request
  waits, all once it is served."""
  from jaxserve.device import program_saves

  monkeypatch.setattr(program_saves, "IDLE_BEFORE_SAVE_S", 2.0)
  cache = tmp_path / "cache"
  config = {**CONFIG, "num_pages": 48}  # programs no other test of the run has compiled
  engine = small_engine(
    warmup="background", compile_threads=2, compilation_cache_dir=str(cache), **config
  )
  engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True), "busy")
  compiler = engine.programs
  store = open_program_store(engine.config, engine.runner.model.config).directory
  assert compiler.wait(timeout=120)  # every program compiled
  time.sleep(3.0)
  unsaved = compiler.num_unsaved
  assert unsaved > 0 and list(store.glob(f"*{SUFFIX}")) == []  # none while a request waits
  run_to_completion(engine)
  deadline = time.monotonic() + 60

  def written() -> int:  # files, and programs XLA cannot serialize (logged, not stored)
    return len(list(store.glob(f"*{SUFFIX}"))) + caplog.text.count("was not stored")

  while written() < unsaved and time.monotonic() < deadline:
    time.sleep(0.1)
  assert written() == unsaved and list(store.glob(f"*{SUFFIX}"))
  engine.ledger.close()
