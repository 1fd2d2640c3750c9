"""Hugging Face model ids resolve from a test-made Hugging Face cache layout (models/hf_cache.py):
`models--ORG--NAME/refs/main` names the snapshot the model loads from, HF_HUB_CACHE wins over
HF_HOME, and an absent model is an error naming the cache path looked at."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxserve.models.hf_cache import hub_cache_dir
from jaxserve.models.registry import checkpoint_dir, load_model, load_model_tokenizer

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
  assert str(expected) in message and "huggingface-cli download" in message
  monkeypatch.delenv("HF_HUB_CACHE")
  assert hub_cache_dir() == tmp_path / "home" / "hub"
  repo = tmp_path / "home" / "hub" / expected.name
  (repo / "snapshots" / REVISION).mkdir(parents=True)  # no refs/main, one snapshot: used,
  with pytest.raises(ValueError, match="without config.json"):  # but it holds no checkpoint
    checkpoint_dir("meta-llama/Llama-3.1-8B-Instruct")
