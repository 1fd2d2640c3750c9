"""The `jaxserve` command: generate, serve, bench and eval on one engine configuration.

Engine settings come from one place: --config FILE (YAML) plus --set KEY=VALUE overrides, with
the common ones (--model, --dtype, ...) as shortcuts for the same overrides.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from jaxserve.config import EngineConfig, load_config

COMMANDS = {}


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


def _generate(args: argparse.Namespace) -> int:
  from jaxserve.llm import LLM
  from jaxserve.sampling_params import SamplingParams

  config = engine_config_from_args(args)
  params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                          top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                          stop=tuple(args.stop or ()), ignore_eos=args.ignore_eos)
  llm = LLM(config.model, config=config)
  prompts = args.prompt or ["Hello, my name is"]
  if args.chat:  # rendered templates carry their own special tokens
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
  for result in llm.generate(prompts, params):
    for completion in result.outputs:
      if args.json:
        print(json.dumps({"prompt": result.prompt or llm.tokenizer.decode(result.prompt_token_ids),
                          "text": completion.text,
                          "token_ids": list(completion.token_ids),
                          "finish_reason": completion.finish_reason}))
      else:
        prompt = result.prompt or llm.tokenizer.decode(result.prompt_token_ids, False)
        print(f"--- prompt: {prompt!r}\n{completion.text}\n"
              f"[{len(completion.token_ids)} tokens, finish_reason={completion.finish_reason}]")
  return 0


def _add_generate(subparsers) -> None:
  parser = subparsers.add_parser("generate", help="generate text offline for one or more prompts",
                                 description="Generate completions offline (no server).")
  add_engine_args(parser)
  parser.add_argument("--prompt", action="append", help="prompt text (repeatable)")
  parser.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
  parser.add_argument("--max-tokens", type=int, default=32)
  parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
  parser.add_argument("--top-p", type=float, default=1.0)
  parser.add_argument("--top-k", type=int, default=0)
  parser.add_argument("--seed", type=int)
  parser.add_argument("--stop", action="append", help="stop string (repeatable)")
  parser.add_argument("--ignore-eos", action="store_true")
  parser.add_argument("--json", action="store_true", help="print one JSON object per completion")
  parser.set_defaults(func=_generate)


def _convert(args: argparse.Namespace) -> int:
  from jaxserve.models.registry import convert_checkpoint

  out = convert_checkpoint(args.model, args.dtype)
  print(f"wrote {out}; `--model {args.model}` now restores these params instead of reconverting "
        "the safetensors")
  return 0


def _add_convert(subparsers) -> None:
  parser = subparsers.add_parser(
      "convert", help="convert a Hugging Face checkpoint once for fast restarts",
      description="Converts a checkpoint's safetensors to jaxserve's params and saves them with "
      "orbax in <checkpoint>/jaxserve_params/, which later loads restore directly.")
  parser.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
  parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
  parser.add_argument("--log-level", default="INFO",
                      choices=["DEBUG", "INFO", "WARNING", "ERROR"])
  parser.set_defaults(func=_convert)


def _config(args: argparse.Namespace) -> int:
  import yaml

  from jaxserve.config import config_to_dict
  print(yaml.safe_dump(config_to_dict(engine_config_from_args(args)), sort_keys=False), end="")
  return 0


def _add_config(subparsers) -> None:
  parser = subparsers.add_parser(
      "config", help="print the resolved engine configuration as YAML",
      description="Prints the engine configuration the other commands would run with: the "
      "defaults, then --config, then the --set overrides and shortcuts, validated. Every key is "
      "described in docs/CONFIG.md.")
  add_engine_args(parser)
  parser.set_defaults(func=_config)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="jaxserve", description="LLM serving on JAX/XLA with a paged KV cache and "
      "continuous batching. Without --model, commands use the built-in tiny-random model.")
  subparsers = parser.add_subparsers(dest="command", required=True)
  _add_generate(subparsers)
  _add_convert(subparsers)
  _add_config(subparsers)
  for register in _optional_commands():
    register(subparsers)
  return parser


def _optional_commands():
  """Subcommands defined next to the code they drive (server, benchmarks, eval)."""
  registrars = []
  for module_name in ("jaxserve.server.cli", "jaxserve.tools.cli", "jaxserve.tpu_aot.cli"):
    try:
      module = __import__(module_name, fromlist=["register"])
    except ModuleNotFoundError as err:
      if err.name and err.name.startswith("jaxserve"):
        continue
      raise
    registrars.append(module.register)
  return registrars


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  logging.basicConfig(level=getattr(args, "log_level", "INFO"),
                      format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  try:
    return args.func(args)
  except ValueError as err:
    print(f"jaxserve {args.command}: error: {err}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
