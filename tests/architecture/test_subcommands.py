"""One subcommand dispatch: only config/subcommands.py calls argparse's add_subparsers (every
command, at every level, is a record of a table)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_graph import PACKAGE, parse

CONFIG = PACKAGE / "config"
SUBCOMMANDS = CONFIG / "subcommands.py"


def subparser_calls(package: Path = PACKAGE) -> list[str]:
  """Where a module of `package` calls argparse's add_subparsers."""
  return [
    f"{path.relative_to(package).as_posix()}:{node.lineno}"
    for path in sorted(package.rglob("*.py"))
    for node in ast.walk(parse(path))
    if isinstance(node, ast.Call)
    and isinstance(node.func, ast.Attribute)
    and node.func.attr == "add_subparsers"
  ]


def test_one_subcommand_dispatch():
  """The commands are tables of config/subcommands.Subcommand records (cli/__init__.py's
  COMMANDS, bench/cli.py's under `bench`); add_subcommands is the one dispatch that builds them."""
  (call,) = subparser_calls()
  assert call.startswith(SUBCOMMANDS.relative_to(PACKAGE).as_posix() + ":")
