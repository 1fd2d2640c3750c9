"""The engine arguments people type, each mapped onto one config key: one table for the CLI flags
(`--gpu-memory-utilization 0.9`) and the offline API's keywords (`LLM(model,
gpu_memory_utilization=0.9)`), named as vLLM names them.

A value given here overrides the same key of the YAML file and of `--set`; every key is described
in docs/CONFIG.md and validated by jaxserve/config/ (a bad value is a ValueError naming the key).
An argument's choices are its key's in config.CHOICES, so a new choice is added there alone.

Token counts take vLLM's human-readable integers as flags (`--max-model-len 32K`,
jaxserve/config/human_ints.py), and the flags have vLLM's short aliases (`-tp`, `-dp`, `-q`, `-ep`).
vLLM engine arguments that mean nothing here (`--trust-remote-code`, `--enforce-eager`, ...) are
jaxserve/config/inert_args.py's: accepted as flags and keywords too, so vLLM command lines and
scripts run unchanged.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from jaxserve.config import CHOICES, EngineConfig
from jaxserve.config.human_ints import human_int
from jaxserve.config.inert_args import INERT_ARGS, check_inert, log_inert
from jaxserve.config.loader import apply_overrides, config_from_dict, config_to_dict


@dataclass(frozen=True)
class EngineArg:
  """`name` is the keyword and, dashed, the flag (plus vLLM's short `aliases`); `key` the dotted
  config key it sets; `type` parses the flag's value (bool: a --x / --no-x pair)."""

  name: str
  key: str
  type: Callable[[str], object]
  help: str
  aliases: tuple[str, ...] = ()

  @property
  def flag(self) -> str:
    return "--" + self.name.replace("_", "-")

  @property
  def choices(self) -> tuple[str, ...]:
    """The values config accepts for `key` where they are a fixed set, else ()."""
    return CHOICES.get(self.key, ())


ENGINE_ARGS: tuple[EngineArg, ...] = (
  EngineArg(
    "model",
    "model",
    str,
    "built-in model name (tiny-random) or a Hugging Face checkpoint directory",
  ),
  EngineArg(
    "revision",
    "revision",
    str,
    "the revision (branch, tag or commit) of a Hugging Face model id to load from the local "
    "cache (null: main)",
  ),
  EngineArg("tokenizer", "tokenizer", str, "tokenizer directory, if not the model's"),
  EngineArg(
    "chat_template",
    "chat_template",
    str,
    "chat template file (or template text) replacing the tokenizer's",
  ),
  EngineArg(
    "generation_config",
    "generation_config",
    str,
    "sampling defaults for requests that leave a field unset: auto (the model's "
    "generation_config.json), vllm (none) or a directory holding a generation_config.json",
  ),
  EngineArg("dtype", "dtype", str, "weights and activations dtype"),
  EngineArg(
    "quantization",
    "quantization",
    str,
    "weight scheme of the projections: a bfloat16 checkpoint is quantized as it loads; none "
    "loads a checkpoint as stored (a compressed-tensors one runs its own scheme)",
    ("-q",),
  ),
  EngineArg(
    "max_model_len",
    "max_model_len",
    human_int,
    "longest prompt + output in tokens, e.g. 8192, 32K (null: the model's max_position_embeddings)",
  ),
  EngineArg("attention_backend", "attention_backend", str, "attention kernel"),
  EngineArg(
    "gpu_memory_utilization",
    "cache.memory_fraction",
    float,
    "share of the device's total memory the process uses; the KV cache gets what the "
    "weights and step scratch leave of it",
  ),
  EngineArg("block_size", "cache.page_size", int, "tokens per KV cache page"),
  EngineArg(
    "kv_cache_dtype",
    "cache.kv_cache_dtype",
    str,
    "KV cache storage: auto (the model's dtype), fp8 (float8_e4m3fn) or int8, the 8-bit ones "
    "with a static scale (cache.kv_scale)",
  ),
  EngineArg(
    "max_num_seqs", "scheduler.max_num_seqs", int, "sequences per step (default: per device)"
  ),
  EngineArg(
    "max_num_batched_tokens",
    "scheduler.max_num_batched_tokens",
    human_int,
    "tokens per step, e.g. 2048, 8k (default: per device)",
  ),
  EngineArg(
    "enable_prefix_caching",
    "scheduler.enable_prefix_caching",
    bool,
    "reuse the KV pages of prompt prefixes already computed",
  ),
  EngineArg(
    "enable_chunked_prefill",
    "scheduler.enable_chunked_prefill",
    bool,
    "split long prompts over several steps",
  ),
  EngineArg("seed", "seed", int, "seed of the random sampling of requests that give none"),
  EngineArg(
    "tensor_parallel_size",
    "tensor_parallel_size",
    int,
    "shard the model over this many devices (all devices of all hosts)",
    ("-tp",),
  ),
  EngineArg(
    "data_parallel_size",
    "data_parallel_size",
    int,
    "engine cores on this host, each on tensor_parallel_size devices of its own, behind the "
    "same API server processes (jaxserve serve)",
    ("-dp",),
  ),
  EngineArg(
    "enable_expert_parallel",
    "enable_expert_parallel",
    bool,
    "split a mixture of experts' experts whole over the tensor_parallel_size devices (the "
    "other weights replicated) instead of splitting each expert",
    ("-ep",),
  ),
  EngineArg(
    "warmup",
    "warmup",
    str,
    "when the step programs compile: all before starting "
    "(full), the largest bucket first and the rest while serving (background), or "
    "each on first use (lazy); auto: serve background, generate and LLM lazy",
  ),
  EngineArg(
    "scheduling_policy",
    "scheduler.policy",
    str,
    "the waiting queue's order: fcfs (arrival) or priority (the request's priority, lower "
    "first, then arrival; the least urgent running request is preempted first)",
  ),
  EngineArg(
    "compile_threads",
    "compile_threads",
    int,
    "step programs compiled at once during warmup and in the background (0: a quarter of the "
    "host's cores, 1 to 4)",
  ),
  EngineArg(
    "enable_sleep_mode",
    "enable_sleep_mode",
    bool,
    "let the engine sleep (level 1: weights to host memory, KV pool freed) and wake up: "
    "LLM.sleep / LLM.wake_up, POST /sleep and /wake_up with VLLM_SERVER_DEV_MODE=1",
  ),
)
BY_NAME = {arg.name: arg for arg in ENGINE_ARGS}
INERT_NAMES = tuple(arg.name for arg in INERT_ARGS)


def is_engine_arg(name: str) -> bool:
  return name in BY_NAME or name in INERT_NAMES


def config_default(key: str) -> object:
  """The default of a dotted config key, e.g. config_default("cache.page_size") == 16."""
  node: object = EngineConfig()
  for part in key.split("."):
    node = getattr(node, part)
  return node


def add_engine_arg_flags(group: argparse._ArgumentGroup, skip: tuple[str, ...] = ()) -> None:
  """One flag per engine argument (a --x / --no-x pair for booleans); default None = unset."""
  for arg in ENGINE_ARGS:
    if arg.name in skip:
      continue
    default = json.dumps(config_default(arg.key))
    help_text = f"{arg.help} (config key {arg.key}; default: {default})"
    _add_flag(group, (arg.flag, *arg.aliases), arg.type, arg.choices, help_text)
  for inert in INERT_ARGS:
    _add_flag(group, inert.flags, inert.type, inert.choices, inert.help)


def _add_flag(
  group: argparse._ArgumentGroup,
  flags: tuple[str, ...],
  parse: Callable[[str], object],
  choices: tuple[str, ...],
  help_text: str,
) -> None:
  if parse is bool:
    group.add_argument(*flags, action=argparse.BooleanOptionalAction, default=None, help=help_text)
  else:
    group.add_argument(*flags, type=parse, choices=choices or None, help=help_text)


def engine_overrides(values: Mapping[str, object]) -> list[str]:
  """`KEY=VALUE` overrides for the given engine arguments (None values skipped); the inert ones
  set nothing, and a value they refuse is a ValueError naming it (inert_args.py)."""
  overrides = []
  for name, value in values.items():
    if name in INERT_NAMES:
      continue
    if name not in BY_NAME:
      raise ValueError(f"{name}: unknown engine argument (known: {', '.join(BY_NAME)})")
    if value is not None:
      overrides.append(f"{BY_NAME[name].key}={json.dumps(value)}")
  check_inert({name: value for name, value in values.items() if name in INERT_NAMES})
  return overrides


def log_inert_args(values: Mapping[str, object]) -> None:
  """The log line of each inert argument given a value that changes nothing (once per
  configuration the user gave: the caller decides when)."""
  log_inert({name: value for name, value in values.items() if name in INERT_NAMES})


def config_with_engine_args(base: EngineConfig, values: Mapping[str, object]) -> EngineConfig:
  """`base` with the engine arguments applied, validated, the inert ones logged; their keys join
  base's explicit keys."""
  overrides = engine_overrides(values)
  log_inert_args(values)
  config = config_from_dict(apply_overrides(config_to_dict(base), overrides))
  set_keys = frozenset(item.split("=", 1)[0] for item in overrides)
  return config.replace(explicit_keys=base.explicit_keys | set_keys)
