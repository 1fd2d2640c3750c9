"""Hugging Face model ids (`meta-llama/Llama-3.1-8B-Instruct`) resolved from the local Hugging
Face cache, offline: the one rule for where a model id's files are. Pure Python; nothing is
downloaded (fetch a model first with `hf download ORG/NAME`, huggingface_hub's command).

The cache directory is, as huggingface_hub decides it: $HF_HUB_CACHE, else
$HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
~/.cache/huggingface/hub (read on every call, so a changed environment is honoured). A model
`ORG/NAME` lives in `<cache>/models--ORG--NAME/`: `refs/main` holds the commit whose files are
`snapshots/<commit>/`. Without `refs/main` (a cache filled by hand) a single snapshot is used.
Another revision (vLLM's `--revision`) resolves as huggingface_hub resolves it in the cache: a
branch or tag through `refs/<revision>`, else a commit naming `snapshots/<revision>/` itself.

find_model_dir(name, revision) returns an existing directory as it is (a directory has no
revisions), else the snapshot directory of the id's revision (None: main), else None;
not_cached_hint(name, revision) words the cache path that was looked at for the error
(models/registry.py raises it, naming the field).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# huggingface_hub's repo id rule: [namespace/]name, letters, digits, - _ . (no -- or ..)
_REPO_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")


def hub_cache_dir() -> Path:
  """The Hugging Face hub cache directory of the current environment."""
  for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
    if os.environ.get(variable):
      return Path(os.environ[variable]).expanduser()
  if os.environ.get("HF_HOME"):
    return Path(os.environ["HF_HOME"]).expanduser() / "hub"
  xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
  return Path(xdg).expanduser() / "huggingface" / "hub"


def looks_like_repo_id(name: str) -> bool:
  """Whether `name` is shaped like a Hugging Face model id (ORG/NAME or NAME)."""
  return bool(_REPO_ID.match(name)) and "--" not in name and ".." not in name


def repo_cache_dir(repo_id: str) -> Path:
  """Where the cache keeps model `repo_id`: <cache>/models--ORG--NAME."""
  return hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
  """The snapshot directory of `repo_id`'s revision (None: main) in the cache, or None."""
  revision = None if revision == "main" else revision
  repo = repo_cache_dir(repo_id)
  snapshots = repo / "snapshots"
  if revision is not None and ".." in Path(revision).parts:  # stays inside the repo's cache
    return None
  ref = repo / "refs" / (revision or "main")
  if ref.is_file():
    snapshot = snapshots / ref.read_text().strip()
    return snapshot if snapshot.is_dir() else None
  if revision is not None:
    snapshot = snapshots / revision
    return snapshot if "/" not in revision and snapshot.is_dir() else None
  found = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
  return found[0] if len(found) == 1 else None


def find_model_dir(name: str, revision: str | None = None) -> Path | None:
  """An existing directory `name`, or the cached snapshot of Hugging Face id `name` at
  `revision` (None: main), or None."""
  path = Path(name).expanduser()
  if path.is_dir():
    return path
  return cached_snapshot(name, revision) if looks_like_repo_id(name) else None


def not_cached_hint(name: str, revision: str | None = None) -> str:
  """Why find_model_dir found nothing for `name`, to append to an error: the cache path looked
  at for an id-shaped name, else ""."""
  if not looks_like_repo_id(name):
    return ""
  which = "its main revision" if revision is None else f"its revision {revision!r}"
  fetch = f"hf download {name}" + ("" if revision is None else f" --revision {revision}")
  return (
    f" nor a Hugging Face model in the local cache (no snapshot of {which} under "
    f"{repo_cache_dir(name)}; the cache is $HF_HUB_CACHE or $HF_HOME/hub; nothing is "
    f"downloaded: run `{fetch}` first)"
  )
