"""Session-cached tiny Hugging Face checkpoints (built once per family / dtype / layout)."""
from __future__ import annotations

from typing import Callable
from pathlib import Path

import pytest

from hf_checkpoints import build_hf_checkpoint


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory) -> Callable[..., Path]:
  """hf_checkpoint(family, *, dtype="float32", sharded=False) -> checkpoint directory."""
  cache: dict[tuple[str, str, bool], Path] = {}

  def get(family: str, *, dtype: str = "float32", sharded: bool = False) -> Path:
    key = (family, dtype, sharded)
    if key not in cache:
      out_dir = tmp_path_factory.mktemp(f"hf_{family}_{dtype}{'_sharded' if sharded else ''}")
      cache[key] = build_hf_checkpoint(family, out_dir, dtype=dtype, sharded=sharded)
    return cache[key]

  return get
