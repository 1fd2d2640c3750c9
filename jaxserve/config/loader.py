"""The configuration loader: one path from a YAML file plus CLI overrides to an EngineConfig.

Every command builds its EngineConfig here with load_config (the dataclasses and their
validation are the jaxserve/config package's): the defaults, then a YAML file, then
`--set KEY=VALUE` overrides, each value parsed as YAML; the engine arguments (CLI flags, `LLM`
keywords: engine_args.py) become such overrides too. A config file mirrors the dataclass tree:

    model: tiny-random
    cache: {page_size: 16, memory_fraction: 0.9}
    scheduler: {max_num_seqs: 64, max_num_batched_tokens: 512}
    server: {port: 8000}

Dotted keys name the same tree: `cache.page_size=32` sets CacheConfig.page_size of
EngineConfig.cache; a top-level key (`model`) is an EngineConfig field, a section key (`cache`,
`scheduler`, `server`, `distributed`) is the nested dataclass _NESTED names. The dotted keys a
file or override sets are kept as EngineConfig.explicit_keys (the device-aware defaults leave
them alone); explicit_keys is no file key (NOT_FILE_KEYS).

Errors are ValueError, and each names the field: an unknown key (with the known ones), a section
that is not a mapping, an override without `=` (naming the override), a value the dataclass
refuses (its message starts with the dotted key); a file that is missing or holds no mapping
names its path. This module imports config, never the reverse, and nothing from jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from jaxserve.config import CacheConfig, DistributedConfig, EngineConfig, SchedulerConfig
from jaxserve.config.server import ServerConfig


def config_from_dict(data: Mapping, cls: type = EngineConfig, prefix: str = ""):
  """Builds a (nested) config dataclass from a mapping; unknown keys raise ValueError."""
  if not isinstance(data, Mapping):
    raise ValueError(f"{prefix or 'config'}: must be a mapping, got {type(data).__name__}")
  fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in NOT_FILE_KEYS}
  kwargs = {}
  for key, value in data.items():
    name = f"{prefix}{key}"
    if key not in fields:
      raise ValueError(f"{name}: unknown config key (known: {', '.join(sorted(fields))})")
    sub_cls = _NESTED.get((cls, key))
    kwargs[key] = config_from_dict(value, sub_cls, f"{name}.") if sub_cls else value
  try:
    return cls(**kwargs)
  except TypeError as err:
    raise ValueError(f"{prefix or 'config'}: {err}") from err


_NESTED = {
  (EngineConfig, "cache"): CacheConfig,
  (EngineConfig, "scheduler"): SchedulerConfig,
  (EngineConfig, "server"): ServerConfig,
  (EngineConfig, "distributed"): DistributedConfig,
}


NOT_FILE_KEYS = ("explicit_keys",)


def config_to_dict(config) -> dict:
  """The config as a file would hold it (without explicit_keys)."""
  data = dataclasses.asdict(config)
  for key in NOT_FILE_KEYS:
    data.pop(key, None)
  return data


def config_yaml(config) -> str:
  """`config` as the YAML a config file holds (every key, in the dataclasses' order)."""
  return yaml.safe_dump(config_to_dict(config), sort_keys=False)


def dotted_keys(data: Mapping, prefix: str = "") -> frozenset[str]:
  """The leaf keys of a nested config mapping, dotted ("scheduler.max_num_seqs")."""
  keys: set[str] = set()
  for key, value in data.items():
    name = f"{prefix}{key}"
    keys |= dotted_keys(value, f"{name}.") if isinstance(value, Mapping) else {name}
  return frozenset(keys)


def non_default_keys(config: EngineConfig) -> frozenset[str]:
  """The dotted keys whose value differs from EngineConfig()'s: what a config object sets."""
  given, default = config_to_dict(config), config_to_dict(EngineConfig())
  return (
    frozenset(key for key in dotted_keys(given) if _at(given, key) != _at(default, key))
    | config.explicit_keys
  )


_ABSENT = object()


def _at(data: Mapping, key: str) -> object:
  """The value at a dotted key; _ABSENT where the path leaves the mapping (a key inside a
  mapping-valued setting, e.g. server.default_chat_template_kwargs, that another config lacks)."""
  node: object = data
  for part in key.split("."):
    if not isinstance(node, Mapping) or part not in node:
      return _ABSENT
    node = node[part]
  return node


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
  """Applies `a.b=value` overrides (value parsed as YAML) to a nested dict, returning a copy."""
  result = yaml.safe_load(yaml.safe_dump(data)) if data else {}
  for item in overrides:
    if "=" not in item:
      raise ValueError(f"override {item!r}: expected KEY=VALUE")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    node = result
    for part in parts[:-1]:
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise ValueError(f"override {item!r}: {part} is not a section")
    node[parts[-1]] = yaml.safe_load(raw)
  return result


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> EngineConfig:
  """Loads a YAML config file (or defaults) and applies dotted overrides."""
  data: dict = {}
  if path is not None:
    path = Path(path)
    if not path.is_file():
      raise ValueError(f"config: file not found: {path}")
    loaded = yaml.safe_load(path.read_text()) or {}
    if not isinstance(loaded, dict):
      raise ValueError(f"config: {path} must hold a mapping at the top level")
    data = loaded
  data = apply_overrides(data, overrides)
  return config_from_dict(data).replace(explicit_keys=dotted_keys(data))
