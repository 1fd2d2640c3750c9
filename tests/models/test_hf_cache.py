"""Hugging Face model ids resolve from a test-made Hugging Face cache layout (models/hf_cache.py):
`models--ORG--NAME/refs/main` names the snapshot the model loads from, HF_HUB_CACHE wins over
HF_HOME, and an absent model is an error naming the cache path looked at. Another revision
(`--revision`, config key revision) resolves through its ref or as a commit, and the loaders
open its snapshot (registry.model_path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxserve.config import EngineConfig
from jaxserve.models.hf_cache import find_model_dir, hub_cache_dir
from jaxserve.models.registry import (
  checkpoint_dir,
  load_configured_tokenizer,
  load_model,
  load_model_tokenizer,
  model_path,
  revision_note,
)
from jaxserve.tools.kv_plan import model_config_for

REPO_ID = "jaxserve-test/tiny-llama"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def make_hf_cache(hub: Path, repo_id: str, checkpoint: Path, revision: str = REVISION) -> Path:
  """The hub cache layout huggingface_hub writes: blobs are left out, the snapshot holds links
  to the checkpoint's files (as the real cache links to its blobs). Returns the snapshot."""
  repo = hub / ("models--" + repo_id.replace("/", "--"))
  snapshot = repo / "snapshots" / revision
  snapshot.mkdir(parents=True)
  for item in checkpoint.iterdir():
    (snapshot / item.name).symlink_to(item.resolve())
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(revision)
  return snapshot


def test_a_model_id_loads_from_the_cache_under_hf_home(tmp_path, monkeypatch, hf_checkpoint):
  checkpoint = hf_checkpoint("llama")
  monkeypatch.delenv("HF_HUB_CACHE", raising=False)
  monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
  snapshot = make_hf_cache(tmp_path / "hf_home" / "hub", REPO_ID, checkpoint)
  # another snapshot that refs/main does not name is not used
  (snapshot.parent / ("f" * 40)).mkdir()
  assert checkpoint_dir(REPO_ID) == snapshot
  assert load_model_tokenizer(REPO_ID).encode("hello") == load_model_tokenizer(
    str(checkpoint)
  ).encode("hello")
  loaded = load_model(REPO_ID)
  assert loaded.source == f"safetensors:{snapshot}"
  assert loaded.config.vocab_size == load_model(str(checkpoint)).config.vocab_size


def test_hf_hub_cache_wins_and_a_missing_model_names_the_cache_path(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  assert hub_cache_dir() == tmp_path / "hub"
  expected = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct"
  with pytest.raises(ValueError) as err:
    checkpoint_dir("meta-llama/Llama-3.1-8B-Instruct")
  message = str(err.value)
  assert message.startswith("model: 'meta-llama/Llama-3.1-8B-Instruct' is neither 'tiny-random'")
  assert str(expected) in message
  assert "run `hf download meta-llama/Llama-3.1-8B-Instruct` first" in message
  monkeypatch.delenv("HF_HUB_CACHE")
  assert hub_cache_dir() == tmp_path / "home" / "hub"
  repo = tmp_path / "home" / "hub" / expected.name
  (repo / "snapshots" / REVISION).mkdir(parents=True)  # no refs/main, one snapshot: used,
  with pytest.raises(ValueError, match="without config.json"):  # but it holds no checkpoint
    checkpoint_dir("meta-llama/Llama-3.1-8B-Instruct")


def test_a_revision_loads_its_own_snapshot(tmp_path, monkeypatch, hf_checkpoint):
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  main = make_hf_cache(tmp_path / "hub", REPO_ID, hf_checkpoint("llama"))
  commit = "f" * 40  # revision v1: another checkpoint (qwen2) under its own commit
  v1 = main.parent / commit
  v1.mkdir()
  for item in hf_checkpoint("qwen2").iterdir():
    (v1 / item.name).symlink_to(item.resolve())
  (main.parents[1] / "refs" / "v1").write_text(commit)
  assert find_model_dir(REPO_ID) == find_model_dir(REPO_ID, "main") == main
  assert find_model_dir(REPO_ID, "v1") == find_model_dir(REPO_ID, commit) == v1
  assert find_model_dir(REPO_ID, "../../elsewhere") is None
  pinned = EngineConfig(model=REPO_ID, revision="v1")
  assert model_path(pinned) == str(v1)
  assert revision_note(pinned) == f"model {REPO_ID} at revision v1: {v1}"
  assert (
    model_config_for(pinned).architecture
    == model_config_for(EngineConfig(model=str(v1))).architecture
  )
  assert (
    model_config_for(pinned).architecture
    != model_config_for(EngineConfig(model=REPO_ID)).architecture
  )
  assert load_configured_tokenizer(pinned).encode("hello") == load_model_tokenizer(str(v1)).encode(
    "hello"
  )
  with pytest.raises(ValueError) as err:
    model_path(pinned.replace(revision="v2"))
  message = str(err.value)
  assert "no snapshot of its revision 'v2'" in message
  assert f"run `hf download {REPO_ID} --revision v2` first" in message
  for model in ("tiny-random", str(v1)):  # a built-in model or a directory has no revisions
    config = EngineConfig(model=model, revision="v1")
    assert model_path(config) == model
    assert revision_note(config).startswith("revision 'v1': accepted, changes nothing: ")
