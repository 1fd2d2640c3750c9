"""Compile results of TPU step programs kept across runs: what a compile said of a program (its
memory analysis and cost), keyed by everything that decides it.

Why: an executable compiled for a TPU topology without a TPU client cannot be read back from
JAX's persistent compilation cache, so every `jaxserve compile-tpu` run (and every run of the
tests that prove it) compiled every program again, although a compile's result is a function of
its inputs. This cache keeps the result, not the executable; build.py keeps only successes (a
refusal may be the host's, e.g. its memory, so it is compiled again).

The key is a SHA-256 of the lowered program's StableHLO text (its shapes, shardings, partition
count and the Pallas kernels' serialized Mosaic), the target (the chip and topology), the
versions of jax, jaxlib and libtpu, and the XLA_FLAGS and LIBTPU_INIT_ARGS of the process: a
change to any of them is a miss. A value is a JSON file `<key>.json` in the cache's directory,
written whole (a temporary file renamed), so a reader never sees half of one. Off unless a
directory is given (`compile-tpu --result-cache DIR`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import jax

from jaxserve.tpu_aot.cost import ProgramCost
from jaxserve.tpu_aot.memory import ProgramMemory

ENV_KEYS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


@dataclass(frozen=True)
class CompileOutcome:
  """What one compile said: memory and cost, or the compiler's message (error)."""

  memory: ProgramMemory | None
  cost: ProgramCost | None
  error: str | None


def _version(distribution: str) -> str:
  try:
    return metadata.version(distribution)
  except metadata.PackageNotFoundError:
    return "absent"


def toolchain() -> str:
  """The compiler's identity: jax, jaxlib and libtpu versions and the flags XLA reads."""
  parts = [f"jax={jax.__version__}", f"jaxlib={_version('jaxlib')}"]
  parts.append(f"libtpu={_version('libtpu')}/{_version('libtpu-nightly')}")
  parts += [f"{key}={os.environ.get(key, '')}" for key in ENV_KEYS]
  return "\n".join(parts)


@dataclass(frozen=True)
class CompileResultCache:
  directory: Path

  def key(self, program_text: str, target: str) -> str:
    """program_text: the lowered program's StableHLO; target: e.g. "v5e:2x4"."""
    digest = hashlib.sha256()
    for part in (toolchain(), target, program_text):
      digest.update(part.encode())
      digest.update(b"\0")
    return digest.hexdigest()

  def get(self, key: str) -> CompileOutcome | None:
    path = self.directory / f"{key}.json"
    try:
      data = json.loads(path.read_text())
    except (OSError, ValueError):
      return None
    memory, cost = data.get("memory"), data.get("cost")
    return CompileOutcome(
      ProgramMemory(**memory) if memory else None,
      ProgramCost(**cost) if cost else None,
      data.get("error"),
    )

  def put(self, key: str, outcome: CompileOutcome) -> None:
    self.directory.mkdir(parents=True, exist_ok=True)
    data = {
      "memory": dataclasses.asdict(outcome.memory) if outcome.memory else None,
      "cost": dataclasses.asdict(outcome.cost) if outcome.cost else None,
      "error": outcome.error,
    }
    with tempfile.NamedTemporaryFile("w", dir=self.directory, delete=False) as handle:
      json.dump(data, handle)
    os.replace(handle.name, self.directory / f"{key}.json")
