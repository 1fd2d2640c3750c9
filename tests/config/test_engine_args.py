"""The engine arguments take their choices from config: each argument whose config key has a
fixed set of values (config.CHOICES) offers exactly that tuple, as its flag's choices too, and
config validates the key against the same tuple, so a new choice is added in one place."""

from __future__ import annotations

import argparse

import pytest

from jaxserve.config import CHOICES
from jaxserve.config.engine_args import ENGINE_ARGS, add_engine_arg_flags, config_default
from jaxserve.config.loader import config_from_dict


def test_every_engine_arg_uses_configs_choices_for_its_key():
  for arg in ENGINE_ARGS:
    if arg.key in CHOICES:
      assert arg.choices is CHOICES[arg.key], arg.name
    else:
      assert arg.choices == (), arg.name
  assert {arg.key for arg in ENGINE_ARGS if arg.choices} == {
    "dtype",
    "attention_backend",
    "warmup",
    "quantization",
    "cache.kv_cache_dtype",
    "scheduler.policy",
  }


def test_each_flag_offers_exactly_those_choices():
  parser = argparse.ArgumentParser()
  add_engine_arg_flags(parser.add_argument_group("engine"))
  flags = {action.option_strings[0]: action for action in parser._actions if action.option_strings}
  for arg in ENGINE_ARGS:
    assert tuple(flags[arg.flag].choices or ()) == arg.choices, arg.flag


def _nested(key: str, value: str) -> dict:
  """{"cache.kv_cache_dtype": v} as the config file writes it: {"cache": {"kv_cache_dtype": v}}."""
  for part in reversed(key.split(".")):
    value = {part: value}
  return value


def _get(config, key: str):
  for part in key.split("."):
    config = getattr(config, part)
  return config


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_config_accepts_exactly_the_choices_of_each_key(key):
  assert config_default(key) in CHOICES[key]
  for value in CHOICES[key]:
    assert _get(config_from_dict(_nested(key, value)), key) == value
  with pytest.raises(ValueError, match=rf"^{key}: must be one of"):
    config_from_dict(_nested(key, "no-such-choice"))
