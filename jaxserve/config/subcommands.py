"""A command of the `jaxserve` CLI as a record, and the one function that builds a level of the
parser from a table of them.

A `Subcommand` names the command, its --help line and description, the function that adds its
flags and the one that runs it, or the commands under it (`jaxserve bench <name>`). Each package
that drives a command exports its records (server/cli.py `serve`, bench/cli.py `bench` and its
commands, tools/cli.py `eval` and `kv-plan`, tpu_aot/cli.py `compile-tpu`), and cli/__init__.py
holds the one table of the top-level commands. `add_subcommands` is the dispatch, written once
for every level: a parser per record, its flags, then its commands (argparse dest
`<name>_command`) or what it runs (`func`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

Run = Callable[[argparse.Namespace], int]
AddFlags = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Subcommand:
  name: str
  help: str
  description: str
  add_flags: AddFlags | None = None
  run: Run | None = None
  commands: tuple[Subcommand, ...] = ()  # `jaxserve <name> <command>`; else `run` runs it


def add_subcommands(
  parser: argparse.ArgumentParser, commands: tuple[Subcommand, ...], dest: str
) -> None:
  """A subparser per command of `commands` under `parser` (the chosen name in `dest`)."""
  subparsers = parser.add_subparsers(dest=dest, required=True)
  for command in commands:
    sub = subparsers.add_parser(command.name, help=command.help, description=command.description)
    if command.add_flags is not None:
      command.add_flags(sub)
    if command.commands:
      add_subcommands(sub, command.commands, f"{command.name.replace('-', '_')}_command")
    if command.run is not None:
      sub.set_defaults(func=command.run)
