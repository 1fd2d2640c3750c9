"""Resolves a model name to (config, params): the built-in `tiny-random` or a checkpoint directory.

A checkpoint directory holds a Hugging Face `config.json` plus safetensors weights. It may also
hold `jaxserve_params/`, an orbax checkpoint of the converted params written by `convert_checkpoint`;
when present it is restored instead of reconverting the safetensors (a fast restart).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jaxserve.models.checkpoint import restore_params, save_params
from jaxserve.models.model_config import DTYPES, ModelConfig
from jaxserve.models.tiny_random import TINY_RANDOM_NAME, tiny_random_config, tiny_random_params
from jaxserve.models.weights import CONFIG_FILE, load_hf_config, load_hf_params, param_shapes

PARAMS_SUBDIR = "jaxserve_params"


@dataclass(frozen=True)
class LoadedModel:
  config: ModelConfig
  params: dict
  source: str  # "tiny-random", "safetensors:<dir>" or "orbax:<dir>"


def load_model(model: str, dtype: str = "auto") -> LoadedModel:
  """Loads `model` ("tiny-random" or a checkpoint directory) in `dtype` ("auto" keeps the
  checkpoint's; float16 checkpoints become bfloat16)."""
  if dtype != "auto" and dtype not in DTYPES:
    raise ValueError(f"dtype: must be 'auto' or one of {DTYPES}, got {dtype!r}")
  if model == TINY_RANDOM_NAME:
    config = tiny_random_config()
    if dtype != "auto":
      config = config.replace(dtype=dtype)
    return LoadedModel(config, tiny_random_params(config), TINY_RANDOM_NAME)
  path = Path(model).expanduser()
  if not path.is_dir() or not (path / CONFIG_FILE).is_file():
    raise ValueError(f"model: {model!r} is neither {TINY_RANDOM_NAME!r} nor a directory "
                     f"holding {CONFIG_FILE}")
  config = load_hf_config(path, dtype)
  orbax_dir = path / PARAMS_SUBDIR
  if orbax_dir.is_dir():
    return LoadedModel(config, restore_params(orbax_dir, param_shapes(config)), f"orbax:{orbax_dir}")
  return LoadedModel(config, load_hf_params(path, config), f"safetensors:{path}")


def convert_checkpoint(checkpoint_dir: str | Path, dtype: str = "auto") -> Path:
  """Converts a HF checkpoint once and saves it as `<checkpoint_dir>/jaxserve_params/`."""
  checkpoint_dir = Path(checkpoint_dir)
  config = load_hf_config(checkpoint_dir, dtype)
  return save_params(load_hf_params(checkpoint_dir, config), checkpoint_dir / PARAMS_SUBDIR)
