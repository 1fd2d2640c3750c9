"""The engine flags every `jaxserve` command (and the benchmarks) share: --config FILE, --set
KEY=VALUE overrides, and shortcuts (--model, --dtype, ...) for the same overrides."""
from __future__ import annotations

import argparse
import json

from jaxserve.config import EngineConfig, load_config


def add_engine_args(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group("engine")
  group.add_argument("--model", help="built-in model name (tiny-random) or a Hugging Face "
                     "checkpoint directory (default: tiny-random)")
  group.add_argument("--config", help="YAML config file (see configs/; keys in docs/CONFIG.md)")
  group.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. --set cache.page_size=32 (repeatable)")
  group.add_argument("--dtype", choices=["auto", "float32", "bfloat16"])
  group.add_argument("--max-model-len", type=int)
  group.add_argument("--attention-backend",
                     choices=["auto", "reference", "xla", "pallas_gpu", "pallas_tpu"])
  group.add_argument("--log-level", default="INFO",
                     choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
  overrides = list(args.overrides)
  for flag, key in (("model", "model"), ("dtype", "dtype"), ("max_model_len", "max_model_len"),
                    ("attention_backend", "attention_backend")):
    value = getattr(args, flag, None)
    if value is not None:
      overrides.append(f"{key}={json.dumps(value) if isinstance(value, str) else value}")
  return load_config(args.config, overrides)
