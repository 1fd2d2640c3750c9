"""No configuration outside config/: no other module is named for it, reads YAML, defines a
*Config / *Args / *Settings class or adds a `--set` override (NOT_CONFIGURATION: what only looks
like configuration, each with why)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.source_graph import PACKAGE, parse, within

CONFIG = PACKAGE / "config"
CONFIG_WORD = re.compile(r"config|args|flags|defaults|settings")
CONFIG_CLASS = re.compile(r"(Config|Args|Settings)$")
# What outside config/ looks like configuration but is not jaxserve's own settings, and why.
NOT_CONFIGURATION = {
  "models/model_config.py": "the checkpoint's config.json, as the model families read it",
  "models/model_config.py class ModelConfig": "the checkpoint's config.json, read",
  "models/hf_config.py": "reads a checkpoint's config.json into a ModelConfig",
  "models/hf_config_json.py": "writes a ModelConfig back as a checkpoint's config.json",
  "models/moe_config.py": "a checkpoint's experts, from its config.json",
  "tokenizer/configured.py": "loads the tokenizer the config's tokenizer keys name",
  "bench/flags.py": "a benchmark run's own flags (the engine's: config/cli_args.py)",
  "bench/soak_flags.py": "the soak benchmark's own flags",
  "bench/serve_client.py class ServeBenchConfig": "a serving benchmark run's parameters",
  "core/info.py class ApiProcessArgs": "what the engine core hands an API process (IPC)",
}


def configuration_in(path: Path, package: Path = PACKAGE) -> list[str]:
  """What module `path` holds of configuration: a name that says so (config, args, flags,
  defaults, settings), YAML (the config file's format), a class named *Config, *Args or
  *Settings, a `--set` override added to a parsed command line (`args.overrides.append(...)`)."""
  where = path.relative_to(package).as_posix()
  found = [where] if CONFIG_WORD.search(path.stem) else []
  for node in ast.walk(parse(path)):
    if (isinstance(node, ast.Import) and any(within(a.name, ("yaml",)) for a in node.names)) or (
      isinstance(node, ast.ImportFrom) and within(node.module or "", ("yaml",))
    ):
      found.append(f"{where} imports yaml")
    elif isinstance(node, ast.ClassDef) and CONFIG_CLASS.search(node.name):
      found.append(f"{where} class {node.name}")
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr in ("append", "extend")
      and isinstance(node.func.value, ast.Attribute)
      and node.func.value.attr == "overrides"
    ):
      found.append(f"{where}:{node.lineno} .overrides.{node.func.attr}(...)")
  return found


def configuration_outside_config(package: Path = PACKAGE) -> set[str]:
  config = package / "config"
  return {
    found
    for path in sorted(package.rglob("*.py"))
    if config not in path.parents
    for found in configuration_in(path, package)
  }


def test_no_configuration_outside_config():
  """config/ owns every setting: its tree, the YAML / --set loader, the flags and their help,
  the engine arguments, the device-aware defaults. Nothing else is named for configuration,
  reads YAML, defines a *Config / *Args / *Settings class or adds a `--set` override, but
  what NOT_CONFIGURATION lists (each with why; none stale)."""
  found = configuration_outside_config()
  assert sorted(found - set(NOT_CONFIGURATION)) == []
  assert set(NOT_CONFIGURATION) <= found


def test_the_configuration_rule_catches_what_it_is_for(tmp_path):
  package = tmp_path / "jaxserve"
  (package / "config").mkdir(parents=True)
  (package / "server").mkdir()
  (package / "config" / "loader.py").write_text("import yaml\nclass EngineConfig: ...\n")
  (package / "server" / "server_flags.py").write_text("")
  (package / "server" / "cli.py").write_text(
    "from yaml import safe_load\n"
    "class ServeArgs: ...\n"
    "def serve(args):\n"
    "  args.overrides.append('server.port=1')\n"
    "  overrides = []\n"
    "  overrides.append('not a parsed command line')\n"
  )
  assert sorted(configuration_outside_config(package)) == [
    "server/cli.py class ServeArgs",
    "server/cli.py imports yaml",
    "server/cli.py:4 .overrides.append(...)",
    "server/server_flags.py",
  ]
