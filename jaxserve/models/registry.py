"""Resolves a model name to its config, params, tokenizer and sampling defaults: a built-in model
(models/builtin.py), a checkpoint directory, or a Hugging Face model id in the local Hugging
Face cache (models/hf_cache.py, offline: its snapshot directory is the checkpoint directory).
An engine opens `model_path(config)`: config.model, or with config.revision the snapshot
directory of that revision of its id (config.model stays the name the engine serves under).

A checkpoint directory holds a Hugging Face `config.json` plus safetensors weights. It may also hold
`jaxserve_params/`, an orbax checkpoint of the converted params written by `convert_checkpoint`;
when present it is restored instead of reconverting the safetensors (a fast restart). Sharded
loading (parallel/sharded_loading.py) resolves names through checkpoint_dir and is_builtin too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jaxserve.config import EngineConfig
from jaxserve.config.generation_config import (
  AUTO,
  VLLM,
  GenerationDefaults,
  read_generation_defaults,
)
from jaxserve.models.builtin import (
  BUILTIN_MODELS,
  builtin_config,
  builtin_params,
  builtin_tokenizer,
  is_builtin,
)
from jaxserve.models.checkpoint import restore_params, save_params
from jaxserve.models.fused_projections import fuse_params
from jaxserve.models.hf_cache import find_model_dir, not_cached_hint
from jaxserve.models.model_config import DTYPES, ModelConfig
from jaxserve.models.quantized_dense import quantize_params
from jaxserve.models.quantized_loading import read_stored_quantization
from jaxserve.models.weight_transfer import TransferOptions
from jaxserve.models.weights import (
  CONFIG_FILE,
  load_hf_config,
  load_hf_params,
  load_hf_weights,
  param_shapes,
)
from jaxserve.quantization.compressed_tensors import resolve_quantization
from jaxserve.quantization.scheme import check_quantization, scheme_for
from jaxserve.tokenizer.configured import chat_template_source, with_chat_template
from jaxserve.tokenizer.tokenizer import Tokenizer, load_tokenizer

PARAMS_SUBDIR = "jaxserve_params"


@dataclass(frozen=True)
class LoadedModel:
  config: ModelConfig
  params: dict
  source: str  # a built-in name, "safetensors:<dir>" or "orbax:<dir>"
  packed: bool = False  # laid out with no holes between them (weight_transfer's packed layout)


def check_dtype(dtype: str) -> None:
  if dtype != "auto" and dtype not in DTYPES:
    raise ValueError(f"dtype: must be 'auto' or one of {DTYPES}, got {dtype!r}")


def _builtin_names() -> str:
  return " or ".join(repr(name) for name in BUILTIN_MODELS)


def model_dir(
  name: str, field: str = "model", kind: str = "checkpoint", revision: str | None = None
) -> Path:
  """The directory `name` stands for (itself, or a Hugging Face id's cached snapshot at
  `revision`, None: main); ValueError naming `field` (and the cache path looked at) if it is
  neither built in nor one."""
  path = find_model_dir(name, revision)
  if path is None:
    raise ValueError(
      f"{field}: {name!r} is neither {_builtin_names()} nor a {kind} directory"
      + not_cached_hint(name, revision)
    )
  return path


def model_path(config: EngineConfig) -> str:
  """What the loaders open for `config`: config.model, or, with config.revision and a Hugging
  Face id, the snapshot directory of that revision (ValueError naming the model and revision if
  the cache has none). A built-in model or a directory has no revisions: config.model."""
  model = config.model
  if config.revision is None or is_builtin(model) or Path(model).expanduser().is_dir():
    return model
  return str(model_dir(config.model, revision=config.revision))


def revision_note(config: EngineConfig) -> str | None:
  """What config.revision does, for the start-up log (None: no revision given); resolving it,
  a revision the cache does not hold is the ValueError of model_path."""
  if config.revision is None:
    return None
  path = model_path(config)
  if path == config.model:
    return (
      f"revision {config.revision!r}: accepted, changes nothing: {config.model!r} is not a "
      "Hugging Face model id (a built-in model or a directory has no revisions)"
    )
  return f"model {config.model} at revision {config.revision}: {path}"


def checkpoint_dir(model: str) -> Path:
  """The checkpoint directory `model` names (a directory or a cached Hugging Face id);
  ValueError if it is neither built in nor one."""
  path = model_dir(model)
  if not (path / CONFIG_FILE).is_file():
    raise ValueError(f"model: {model!r} is a directory without {CONFIG_FILE} ({path})")
  return path


def load_model(
  model: str,
  dtype: str = "auto",
  *,
  quantization: str = "none",
  fuse_projections: bool = False,
  transfer: TransferOptions = TransferOptions(),
) -> LoadedModel:
  """Loads `model` (a built-in name or a checkpoint directory) in `dtype` ("auto" keeps the
  checkpoint's; float16 checkpoints become bfloat16); fuse_projections merges q/k/v and gate/up
  (models/fused_projections; one device only), while converting a safetensors checkpoint
  (`transfer`: how its tensors are moved, models/weight_transfer.py). `quantization` (a
  jaxserve/quantization/scheme.py name) quantizes the projections as they load; a
  compressed-tensors checkpoint loads as stored whatever it says, unless it names another
  scheme (an error, before any weight is read)."""
  check_dtype(dtype)
  check_quantization(quantization)
  if is_builtin(model):
    config = builtin_config(model, dtype)
    loaded = _fused(config, builtin_params(model, config), model, fuse_projections)
    return _quantized(loaded, quantization)
  path = checkpoint_dir(model)
  config = load_hf_config(path, dtype)
  quantization = model_quantization(model, quantization)
  orbax_dir = path / PARAMS_SUBDIR
  if orbax_dir.is_dir():
    restored = restore_params(orbax_dir, param_shapes(config))
    loaded = _fused(config, restored, f"orbax:{orbax_dir}", fuse_projections)
    return _quantized(loaded, quantization)
  config = config.replace(quantization=quantization)
  params, stats = load_hf_weights(path, config, fuse=fuse_projections, options=transfer)
  return LoadedModel(
    config.replace(fused_projections=fuse_projections), params, f"safetensors:{path}", stats.packed
  )


def model_quantization(model: str, requested: str) -> str:
  """The scheme `model` runs when `requested` is configured, from its config.json alone (no
  weight is read): a compressed-tensors checkpoint's own (another requested scheme is a
  ValueError), else `requested` (quantized on load)."""
  check_quantization(requested)
  if is_builtin(model):
    return requested
  return resolve_quantization(requested, read_stored_quantization(checkpoint_dir(model)))


def _fused(config: ModelConfig, params: dict, source: str, fuse: bool) -> LoadedModel:
  """Merged after loading (`params` alone holds the tree: each layer's parts are freed as it is
  merged)."""
  if fuse:
    params = fuse_params(dict(params))
  return LoadedModel(config.replace(fused_projections=fuse), params, source)


def _quantized(loaded: LoadedModel, quantization: str) -> LoadedModel:
  """A float model's projections quantized after loading (built-in and orbax weights); a model
  already in that scheme (a converted compressed-tensors checkpoint) as it is."""
  scheme = scheme_for(quantization)
  if scheme is None or loaded.config.quantization == quantization:
    return loaded
  params = quantize_params(dict(loaded.params), scheme)
  return LoadedModel(loaded.config.replace(quantization=quantization), params, loaded.source)


def load_model_tokenizer(model: str) -> Tokenizer:
  """The tokenizer of `model`: a built-in model's own, or the checkpoint directory's."""
  if is_builtin(model):
    return builtin_tokenizer(model)
  return load_tokenizer(str(model_dir(model)))


def load_configured_tokenizer(config: EngineConfig) -> Tokenizer:
  """The engine's tokenizer: config.tokenizer's (a built-in name or a tokenizer directory),
  else the model's, with config.chat_template replacing its template."""
  name = config.tokenizer
  if name is not None and not is_builtin(name):
    name = str(model_dir(name, "tokenizer", "tokenizer"))
  tokenizer = load_model_tokenizer(name or model_path(config))
  if config.chat_template is not None:
    tokenizer = with_chat_template(tokenizer, chat_template_source(config.chat_template))
  return tokenizer


def generation_defaults(config: EngineConfig) -> GenerationDefaults:
  """The sampling defaults config.generation_config names (jaxserve/config/generation_config.py):
  the model's generation_config.json ("auto"; a built-in model has none), none ("vllm"), or a
  directory's (which must hold one; ValueError naming generation_config otherwise)."""
  setting = config.generation_config
  if setting == VLLM:
    return GenerationDefaults()
  if setting == AUTO:
    if is_builtin(config.model):
      return GenerationDefaults(source="model")
    return read_generation_defaults(str(model_dir(config.model)), "model", required=False)
  path = os.path.expanduser(setting)
  if not os.path.isdir(path):
    raise ValueError(f"generation_config: {setting!r} is neither auto, vllm nor a directory")
  return read_generation_defaults(path, path, required=True)


def convert_checkpoint(checkpoint_dir: str | Path, dtype: str = "auto") -> Path:
  """Converts a HF checkpoint once and saves it as `<checkpoint_dir>/jaxserve_params/`."""
  checkpoint_dir = Path(checkpoint_dir)
  config = load_hf_config(checkpoint_dir, dtype)
  return save_params(load_hf_params(checkpoint_dir, config), checkpoint_dir / PARAMS_SUBDIR)
