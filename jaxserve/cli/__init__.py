"""The `jaxserve` command: generate, serve, bench and eval on one engine configuration.

Engine settings come from one place: --config FILE (YAML) plus --set KEY=VALUE overrides, with
the common ones (--model, --max-num-seqs, --gpu-memory-utilization, ...;
jaxserve/config/engine_args.py) as flags for the same overrides (jaxserve/config/cli_args.py adds
them to a parser). Every --help shows defaults; a misspelt flag gets a "did you mean"
(jaxserve/config/cli_help.py). COMMANDS is the one table of the commands
(config/subcommands.py records; add_subcommands builds the parser from it): generate, convert
and config here, and those defined next to the code they drive, imported explicitly: `serve`
(jaxserve/server/cli.py), the benchmarks (jaxserve/bench/cli.py, a table of their own under
`bench`), eval and kv-plan (jaxserve/tools/cli.py), compile-tpu (jaxserve/tpu_aot/cli.py); each of
those imports its heavy module only when it runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from jaxserve import __version__
from jaxserve.bench import cli as bench_cli
from jaxserve.config.cli_args import add_engine_args, engine_config_from_args
from jaxserve.config.cli_help import command_parser, unknown_flags_message, use_defaults_help
from jaxserve.config.inert_args import take_undefined_flags
from jaxserve.config.subcommands import Subcommand, add_subcommands
from jaxserve.device.platform_needs import check_platform
from jaxserve.device.platforms import prepare_jax_process
from jaxserve.runtime.log_setup import configure_logging
from jaxserve.runtime.optional_deps import MissingDependencyError
from jaxserve.server import cli as server_cli
from jaxserve.tools import cli as tools_cli
from jaxserve.tpu_aot import cli as tpu_aot_cli

logger = logging.getLogger(__name__)


def _generate(args: argparse.Namespace) -> int:
  from jaxserve.api.sampling_params import SamplingParams
  from jaxserve.entrypoints.llm import LLM

  config = engine_config_from_args(args)
  params = SamplingParams(
    max_tokens=args.max_tokens,
    temperature=args.temperature,
    top_p=args.top_p,
    top_k=args.top_k,
    seed=args.seed,
    stop=tuple(args.stop or ()),
    ignore_eos=args.ignore_eos,
  )
  llm = LLM(config.model, config=config)
  prompts = args.prompt or ["Hello, my name is"]
  if args.chat:  # rendered templates carry their own special tokens
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
  for result in llm.generate(prompts, params):
    for completion in result.outputs:
      if args.json:
        print(
          json.dumps(
            {
              "prompt": result.prompt or llm.tokenizer.decode(result.prompt_token_ids),
              "text": completion.text,
              "token_ids": list(completion.token_ids),
              "finish_reason": completion.finish_reason,
            }
          )
        )
      else:
        prompt = result.prompt or llm.tokenizer.decode(result.prompt_token_ids, False)
        print(
          f"--- prompt: {prompt!r}\n{completion.text}\n"
          f"[{len(completion.token_ids)} tokens, finish_reason={completion.finish_reason}]"
        )
  return 0


def _generate_flags(parser: argparse.ArgumentParser) -> None:
  add_engine_args(parser, skip=("seed",))
  parser.add_argument(
    "--prompt", action="append", help='prompt text (repeatable; default: "Hello, my name is")'
  )
  parser.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
  parser.add_argument("--max-tokens", type=int, default=32)
  parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
  parser.add_argument("--top-p", type=float, default=1.0)
  parser.add_argument("--top-k", type=int, default=0)
  parser.add_argument("--seed", type=int, help="sampling seed of the requests")
  parser.add_argument("--stop", action="append", help="stop string (repeatable)")
  parser.add_argument("--ignore-eos", action="store_true")
  parser.add_argument("--json", action="store_true", help="print one JSON object per completion")


def _convert(args: argparse.Namespace) -> int:
  from jaxserve.models.registry import convert_checkpoint

  out = convert_checkpoint(args.model, args.dtype)
  print(
    f"wrote {out}; `--model {args.model}` now restores these params instead of reconverting "
    "the safetensors"
  )
  return 0


def _convert_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
  parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
  parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _config(args: argparse.Namespace) -> int:
  from jaxserve.config.loader import config_yaml
  from jaxserve.messages.buckets import BucketSet

  config = engine_config_from_args(args)
  print(config_yaml(config), end="")
  print(f"# buckets: {BucketSet.from_config(config.scheduler).describe()}")
  return 0


def _config_flags(parser: argparse.ArgumentParser) -> None:
  add_engine_args(parser)


# The one table of the `jaxserve` commands (config/subcommands.py builds the parser from it).
COMMANDS: tuple[Subcommand, ...] = (
  Subcommand(
    "generate",
    help="generate text offline for one or more prompts",
    description="Generate completions offline (no server).",
    add_flags=_generate_flags,
    run=_generate,
  ),
  Subcommand(
    "convert",
    help="convert a Hugging Face checkpoint once for fast restarts",
    description="Converts a checkpoint's safetensors to jaxserve's params and saves them with "
    "orbax in <checkpoint>/jaxserve_params/, which later loads restore directly.",
    add_flags=_convert_flags,
    run=_convert,
  ),
  Subcommand(
    "config",
    help="print the resolved engine configuration as YAML",
    description="Prints the engine configuration the other commands would run with: the "
    "defaults, then --config, then the --set overrides and shortcuts, validated, and (as a "
    "comment) the bucket ladders with their largest padding share. Every key is described in "
    "docs/CONFIG.md.",
    add_flags=_config_flags,
    run=_config,
  ),
  server_cli.SERVE,
  bench_cli.BENCH,
  *tools_cli.COMMANDS,
  tpu_aot_cli.COMPILE_TPU,
)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="jaxserve",
    description="LLM serving on JAX/XLA with a paged KV cache and "
    "continuous batching. Without --model, commands use the built-in tiny-random model.",
  )
  parser.add_argument("--version", action="version", version=f"jaxserve {__version__}")
  add_subcommands(parser, COMMANDS, "command")
  use_defaults_help(parser)
  return parser


def _prepare_jax_process(args: argparse.Namespace) -> None:
  """Before any command starts jax: the platform the configuration needs is installed (one line
  naming the install line otherwise), no libtpu probe without a TPU, the client's memory from
  cache.memory_fraction. compile-tpu loads libtpu itself, for a topology."""
  if hasattr(args, "overrides") and args.command not in ("config", "compile-tpu"):
    config = engine_config_from_args(args, announce=False)
    check_platform(config)
    prepare_jax_process(config.cache.memory_fraction)


def parse_command_line(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """`argv` parsed as `jaxserve` parses it, and the log lines of the vLLM flags taken off it
  (inert_args.UNDEFINED_FLAGS); an unknown flag is argparse's error (exit 2) naming the closest
  known flag for each misspelt one."""
  parser = build_parser()
  command = command_parser(parser, argv)
  argv, notes = take_undefined_flags(argv, command._option_string_actions)
  args, unknown = parser.parse_known_args(argv)
  if unknown:
    command.error(unknown_flags_message(command, unknown))
  return args, notes


def main(argv: list[str] | None = None) -> int:
  args, notes = parse_command_line(sys.argv[1:] if argv is None else list(argv))
  configure_logging(getattr(args, "log_level", "INFO"))
  for note in notes:
    logger.info("%s", note)
  try:
    _prepare_jax_process(args)
    return args.func(args)
  except MissingDependencyError as err:
    print(err, file=sys.stderr)
    return 1
  except ValueError as err:
    print(f"jaxserve {args.command}: error: {err}", file=sys.stderr)
    return 2
