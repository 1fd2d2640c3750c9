"""The engine flags every `jaxserve` command (and the benchmarks) share: --config FILE, --set
KEY=VALUE overrides, and the engine arguments (jaxserve/config/engine_args.py) as flags for the same
overrides."""

from __future__ import annotations

import argparse

from jaxserve.config import EngineConfig
from jaxserve.config.engine_args import (
  ENGINE_ARGS,
  INERT_NAMES,
  add_engine_arg_flags,
  engine_overrides,
  log_inert_args,
)
from jaxserve.config.loader import load_config


def add_engine_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
  """The engine flags; `skip` leaves out engine arguments the command uses otherwise (seed)."""
  group = parser.add_argument_group("engine")
  group.add_argument("--config", help="YAML config file (see configs/; keys in docs/CONFIG.md)")
  group.add_argument(
    "--set",
    dest="overrides",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="override a config key, e.g. --set cache.page_size=32 (repeatable; default: none)",
  )
  add_engine_arg_flags(group, skip)
  group.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def engine_config_from_args(args: argparse.Namespace, announce: bool = True) -> EngineConfig:
  """Defaults, then --config, then --set, then the engine flags (and a positional MODEL);
  `announce` logs the flags that change nothing here (once per command: its own call does)."""
  positional = getattr(args, "model_tag", None)
  if positional is not None:
    if getattr(args, "model", None) not in (None, positional):
      raise ValueError(f"model: given twice, {positional!r} and --model {args.model!r}")
    args.model = positional
  values = {arg.name: getattr(args, arg.name, None) for arg in ENGINE_ARGS}
  values.update({name: getattr(args, name, None) for name in INERT_NAMES})
  config = load_config(args.config, list(args.overrides) + engine_overrides(values))
  if announce:
    log_inert_args(values)
  return config
