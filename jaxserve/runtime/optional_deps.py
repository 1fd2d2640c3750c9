"""Optional dependencies: which extra brings which module, checked before a command runs.

The core install serves and generates; benchmarks and parity checks need more (httpx for the load
generator, matplotlib for plots, torch and transformers for the Hugging Face baselines), all in
the `bench` extra. A command asks for what it will import before it does any work, so a missing
package is one line naming the extra, never a traceback and never after a benchmark has run.

`install_command` owns the wording of the install line: jaxserve is installed from its checkout,
so it is README's `pip install -e ".[bench]"` (tests/bench/test_bench_serve.py checks that README
says the same).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

EXTRA_OF = {"httpx": "bench", "matplotlib": "bench", "torch": "bench", "transformers": "bench"}


class MissingDependencyError(Exception):
  """A module a command needs is not installed; the message says which extra installs it."""


@dataclass(frozen=True)
class Requirement:
  module: str
  reason: str  # what the command uses it for, e.g. "plots"


HTTPX = Requirement("httpx", "HTTP client")
MATPLOTLIB = Requirement("matplotlib", "plots")
TORCH = Requirement("torch", "the transformers baseline")
TRANSFORMERS = Requirement("transformers", "the transformers baseline")

Command = Callable[[argparse.Namespace], int]


def installed(module: str) -> bool:
  """Whether `module` can be imported, found without importing it (no import-time side effects;
  a None entry in sys.modules, which makes `import` fail, counts as missing)."""
  if module in sys.modules:
    return sys.modules[module] is not None
  return importlib.util.find_spec(module) is not None


def missing(requirements: Sequence[Requirement]) -> list[Requirement]:
  """The requirements whose module is not installed."""
  return [r for r in requirements if not installed(r.module)]


def require(command: str, requirements: Sequence[Requirement]) -> None:
  """Raises MissingDependencyError naming the packages and the extra if any is missing."""
  absent = missing(requirements)
  if not absent:
    return
  extras = sorted({EXTRA_OF.get(r.module, "bench") for r in absent})
  what = ", ".join(f"{r.module} ({r.reason})" for r in absent)
  raise MissingDependencyError(
    f"{command} needs {what}, which is not installed: {install_command(extras)}"
  )


def install_command(extras: Sequence[str]) -> str:
  """The command that installs `extras` into a checkout's environment (README's wording)."""
  return f'pip install -e ".[{",".join(extras)}]"'


def requiring(run: Command, needs: Callable[[argparse.Namespace], list[Requirement]]) -> Command:
  """`run`, after checking (require) what `needs(args)` lists, before it imports anything."""

  def checked(args: argparse.Namespace) -> int:
    bench = getattr(args, "bench_command", None)
    require(f"jaxserve {args.command}{' ' + bench if bench else ''}", needs(args))
    return run(args)

  return checked
