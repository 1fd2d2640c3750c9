"""vLLM engine arguments that mean nothing in jaxserve, accepted so that vLLM command lines and
scripts run unchanged: each is a flag of every command that takes the engine flags
(engine_args.add_engine_arg_flags) and an `LLM(...)` keyword. A value that is what jaxserve does
anyway passes quietly; any other is logged once, with why it changes nothing (`log_inert`), or,
where it asks for what jaxserve cannot do, is a ValueError naming the argument (`check_inert`).

  trust_remote_code        jaxserve runs no code from a checkpoint (its architectures are built in)
  enforce_eager            JAX compiles every step program ahead of time with XLA; there are no
                           CUDA graphs to leave out
  tokenizer_mode           jaxserve runs the checkpoint's tokenizer.json with the `tokenizers`
                           library, as vLLM's auto and hf do; slow, mistral and custom change
                           nothing
  pipeline_parallel_size   (-pp) 1 is what runs; jaxserve has no pipeline parallelism, so another
                           size is refused (shard over devices with tensor_parallel_size)

UNDEFINED_FLAGS are vLLM flags with one value that no jaxserve command defines yet: cli.main
takes each off the command line before parsing (`take_undefined_flags`, `--flag V` or
`--flag=V`) and logs that it changes nothing, so the line runs instead of stopping at argparse.
A command that defines the flag parses it itself, and its entry here is then to go (the CLI
tests check that no command defines one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InertArg:
  """`name` is the keyword and, dashed, the flag (plus `aliases`); `type` parses a flag's value
  (bool: a --x / --no-x pair); `native` are the values that are what jaxserve does (no line);
  `refused`: any other value is a ValueError rather than a log line."""

  name: str
  why: str
  type: Callable[[str], object] = bool
  choices: tuple[str, ...] = ()
  native: tuple[object, ...] = (False,)
  refused: bool = False
  aliases: tuple[str, ...] = ()

  @property
  def flags(self) -> tuple[str, ...]:
    return ("--" + self.name.replace("_", "-"), *self.aliases)

  @property
  def help(self) -> str:
    if self.refused:
      return f"{' or '.join(map(str, self.native))} only: {self.why}"
    return f"accepted, changes nothing: {self.why}"


INERT_ARGS: tuple[InertArg, ...] = (
  InertArg(
    "trust_remote_code",
    "jaxserve runs no code from a checkpoint (its model architectures are built in)",
  ),
  InertArg(
    "enforce_eager",
    "JAX compiles every step program ahead of time with XLA; there are no CUDA graphs to leave out",
  ),
  InertArg(
    "tokenizer_mode",
    "jaxserve runs the checkpoint's tokenizer.json with the tokenizers library (vLLM's auto)",
    type=str,
    choices=("auto", "hf", "slow", "mistral", "custom"),
    native=("auto", "hf"),
  ),
  InertArg(
    "pipeline_parallel_size",
    "jaxserve has no pipeline parallelism; shard the model over devices with "
    "--tensor-parallel-size",
    type=int,
    native=(1,),
    refused=True,
    aliases=("-pp",),
  ),
)
BY_NAME: Mapping[str, InertArg] = {arg.name: arg for arg in INERT_ARGS}


def check_inert(values: Mapping[str, object]) -> None:
  """A ValueError naming the first argument given a value it does not take (not one of its
  choices) or one jaxserve cannot honour."""
  for name, value in values.items():
    arg = BY_NAME[name]
    if value is None:
      continue
    if arg.choices and value not in arg.choices:
      raise ValueError(f"{name}: must be one of {', '.join(arg.choices)}, got {value!r}")
    if arg.refused and value not in arg.native:
      raise ValueError(f"{name}: must be {' or '.join(map(repr, arg.native))}: {arg.why}")


def log_inert(values: Mapping[str, object]) -> None:
  """One log line for each argument given a value other than what jaxserve does."""
  for name, value in values.items():
    arg = BY_NAME[name]
    if value is None or value in arg.native:
      continue
    given = name if arg.type is bool else f"{name} {value!r}"
    logger.info("%s: accepted, changes nothing: %s", given, arg.why)


UNDEFINED_FLAGS: Mapping[str, str] = {}  # none today: every vLLM flag a user types is defined


def take_undefined_flags(
  argv: Sequence[str], defined: Collection[str]
) -> tuple[list[str], list[str]]:
  """`argv` without the UNDEFINED_FLAGS missing from `defined` (the command's option strings),
  each with its value, and the log line of each taken."""
  kept: list[str] = []
  notes: list[str] = []
  words = iter(argv)
  for word in words:
    flag, equals, value = word.partition("=")
    if flag not in UNDEFINED_FLAGS or flag in defined:
      kept.append(word)
      continue
    if not equals:
      value = next(words, "")
    notes.append(f"{flag} {value}: accepted, changes nothing: {UNDEFINED_FLAGS[flag]}")
  return kept, notes
