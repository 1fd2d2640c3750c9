"""What `jaxserve` prints about its own flags: defaults in every --help, and a "did you mean" for
a misspelt flag (difflib against the flags of the command that was typed)."""

from __future__ import annotations

import argparse
import copy
import difflib
from collections.abc import Iterator, Sequence


class DefaultsHelpFormatter(argparse.HelpFormatter):
  """Appends "(default: X)" to each flag's help unless the help already states its default; a flag
  without help shows its default alone."""

  def _get_help_string(self, action: argparse.Action) -> str:
    help_text = action.help or ""
    if "default" in help_text or action.default is argparse.SUPPRESS or not action.option_strings:
      return help_text
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
      return help_text
    if action.required:
      return f"{help_text} (required; no default)".strip()
    if action.default is None or action.default is False:
      return f"{help_text} (default: unset)".strip()
    return f"{help_text} (default: %(default)s)".strip()

  def _format_action(self, action: argparse.Action) -> str:
    if action.help is None and action.option_strings:  # argparse prints nothing for no help
      action = copy.copy(action)
      action.help = self._get_help_string(action) or None
    return super()._format_action(action)


def all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
  """`parser` and every subcommand parser under it."""
  yield parser
  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      for sub in dict.fromkeys(action.choices.values()):
        yield from all_parsers(sub)


def use_defaults_help(parser: argparse.ArgumentParser) -> None:
  for each in all_parsers(parser):
    each.formatter_class = DefaultsHelpFormatter


def command_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
  """The (sub)parser of the command `argv` names, e.g. `bench serve`'s for ["bench", "serve"]."""
  current = parser
  for word in argv:
    subparsers = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers or word not in subparsers[0].choices:
      if word.startswith("-"):
        continue
      break
    current = subparsers[0].choices[word]
  return current


def unknown_flags_message(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
  """ "unrecognized arguments" with the closest known flag for each misspelt one."""
  known = list(parser._option_string_actions)
  parts = []
  for word in unknown:
    flag = word.split("=", 1)[0]
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("-") else []
    parts.append(f"{word} (did you mean {close[0]}?)" if close else word)
  return "unrecognized arguments: " + " ".join(parts)
