"""Optional dependencies: which extra brings which module, checked before a command runs.

The core install serves and generates; benchmarks and parity checks need more (httpx for the load
generator, matplotlib for plots, torch and transformers for the Hugging Face baselines), all in
the `bench` extra. A command asks for what it will import before it does any work, so a missing
package is one line naming the extra (`pip install 'jaxserve[bench]'`), never a traceback and
never after a benchmark has run.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Sequence

EXTRA_OF = {"httpx": "bench", "matplotlib": "bench", "torch": "bench", "transformers": "bench"}


class MissingDependencyError(Exception):
  """A module a command needs is not installed; the message says which extra installs it."""


@dataclass(frozen=True)
class Requirement:
  module: str
  reason: str  # what the command uses it for, e.g. "plots"


def missing(requirements: Sequence[Requirement]) -> list[Requirement]:
  """The requirements whose module cannot be imported."""
  absent = []
  for requirement in requirements:
    try:
      importlib.import_module(requirement.module)
    except ImportError:
      absent.append(requirement)
  return absent


def require(command: str, requirements: Sequence[Requirement]) -> None:
  """Raises MissingDependencyError naming the packages and the extra if any is missing."""
  absent = missing(requirements)
  if not absent:
    return
  extras = sorted({EXTRA_OF.get(r.module, "bench") for r in absent})
  what = ", ".join(f"{r.module} ({r.reason})" for r in absent)
  install = " ".join(f"'jaxserve[{extra}]'" for extra in extras)
  raise MissingDependencyError(f"{command} needs {what}, which is not installed: "
                               f"pip install {install}")
