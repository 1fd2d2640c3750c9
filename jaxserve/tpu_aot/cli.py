"""`jaxserve compile-tpu`: the server's step programs compiled for a TPU slice, without a TPU.

    jaxserve compile-tpu --config configs/v5e-8.yaml --model-shape llama-3.1-8b

Prints every program's lowering and compile time and memory_analysis per chip, then the server's
per-chip memory (weights, KV pool, largest step transient, program code) against the chip's HBM
and the pages / full-length sequences the pool holds. Exits 0 when it fits, 1 with one line per
cause when it does not, 2 on a bad argument or config. `--result-cache DIR` keeps each program's
compile result (result_cache.py), so a re-run compiles only the programs that changed.

    jaxserve compile-tpu --config configs/v5e-8.yaml --model-shape llama-3.1-8b \
        --layouts dp8tp1,dp4tp2,dp1tp8 --programs largest

does that for each data parallel x tensor parallel layout of the slice (layouts.py), then prints
one row per layout: its per-chip HBM plan and the expected decode throughput from a roofline of
its compiled decode step (roofline.py). Exits 0 when every layout fits, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxserve.config.cli_args import add_engine_args, engine_config_from_args
from jaxserve.config.subcommands import Subcommand
from jaxserve.runtime.optional_deps import install_command
from jaxserve.tools.json_file import write_json


def _flags(parser: argparse.ArgumentParser) -> None:
  """The subcommand's flags; imports nothing heavy (jaxserve.models pulls in JAX, whose logging
  set-up would pre-empt the CLI's)."""
  add_engine_args(parser)
  parser.add_argument(
    "--model-shape",
    metavar="NAME",
    help="a named architecture of jaxserve/models/named_shapes.py instead of "
    "--model, e.g. llama-3.1-8b (no checkpoint needed; default: --model)",
  )
  parser.add_argument(
    "--chip",
    choices=["v5e", "v6e"],
    help="TPU generation (default: from the config file name, e.g. v5e-8.yaml)",
  )
  parser.add_argument(
    "--programs",
    choices=["all", "largest", "decode"],
    default="all",
    help="compile every program, of each kind only the largest bucket's (in the greedy and the "
    "fullest sampler modes), or (with --layouts) only the decode step's (default: all)",
  )
  parser.add_argument(
    "--layouts",
    metavar="LIST",
    help="data parallel x tensor parallel layouts of the slice to plan side by side, e.g. "
    "dp8tp1,dp4tp2,dp1tp8 (each replaces tensor_parallel_size; default: the config's one server)",
  )
  parser.add_argument(
    "--decode-context",
    type=int,
    default=1024,
    metavar="TOKENS",
    help="with --layouts: the context length of every decoding sequence in the throughput "
    "roofline (default: 1024)",
  )
  parser.add_argument("--jobs", type=int, default=1, help="programs compiled at once (default: 1)")
  parser.add_argument(
    "--result-cache",
    metavar="DIR",
    help="keep each program's compile result (memory and cost) in DIR, keyed by its "
    "lowered text, the target and the toolchain, and take it instead of compiling a program "
    "seen before: a re-run compiles only what changed (default: none, every program compiles)",
  )
  parser.add_argument("--out", help="also write the report as JSON to this file (default: none)")
  parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")


def main(args: argparse.Namespace) -> int:
  import jax

  from jaxserve.models.named_shapes import named_model_config
  from jaxserve.models.registry import model_path, model_quantization
  from jaxserve.quantization.capabilities import check_device_runs
  from jaxserve.runtime.device_description import DeviceDescription
  from jaxserve.tools.kv_plan import model_config_for
  from jaxserve.tpu_aot.build import BuildRequest, build
  from jaxserve.tpu_aot.chips import chip_of_config_name, get_chip
  from jaxserve.tpu_aot.report import format_report, report_json

  # Executables compiled for a topology cannot be loaded back from JAX's persistent cache (no
  # TPU client to deserialize them): keep them out of it, and the compile times real.
  jax.config.update("jax_enable_compilation_cache", False)
  config = engine_config_from_args(args)
  chip = get_chip(args.chip) if args.chip else chip_of_config_name(args.config)
  if chip is None:
    raise ValueError("chip: pass --chip (the config file name names no TPU generation)")
  if args.model_shape:  # a named shape is bfloat16: it runs the configured scheme
    model_name = args.model_shape
    model_config = named_model_config(args.model_shape).replace(quantization=config.quantization)
  else:
    model_name, model_config = config.model, model_config_for(config)
  quantization = model_quantization(model_path(config), config.quantization)
  check_device_runs(quantization, DeviceDescription("tpu", None, chip.device_kind))
  request = BuildRequest(
    config,
    model_config,
    model_name,
    chip,
    args.programs,
    args.jobs,
    not args.no_progress,
    result_cache=Path(args.result_cache).expanduser() if args.result_cache else None,
  )
  if args.layouts:
    return _layouts(args, request)
  report = build(request)
  print(format_report(report))
  if args.out:
    print(f"wrote {write_json(args.out, report_json(report))}")
  if not report.fits:
    for problem in report.problems:
      print(f"jaxserve compile-tpu: does not fit: {problem}", file=sys.stderr)
    return 1
  return 0


def _layouts(args: argparse.Namespace, request) -> int:
  from dataclasses import replace

  from jaxserve.tpu_aot.layouts import format_layouts, layouts_json, parse_layouts, plan_layouts
  from jaxserve.tpu_aot.report import format_report

  layouts = parse_layouts(args.layouts)
  plans = plan_layouts(replace(request, decode_context=args.decode_context), layouts)
  for plan in plans:
    print(format_report(plan.report), end="\n\n")
  print(format_layouts(plans))
  if args.out:
    print(f"wrote {write_json(args.out, layouts_json(plans))}")
  for plan in plans:
    for problem in plan.report.problems:
      print(f"jaxserve compile-tpu: {plan.layout.name}: does not fit: {problem}", file=sys.stderr)
  return 0 if all(plan.report.fits for plan in plans) else 1


COMPILE_TPU = Subcommand(
  "compile-tpu",
  help="compile every step program for a TPU topology and check its memory",
  description="Builds the step programs `jaxserve serve --config ...` runs on a TPU slice "
  "(forward per bucket, sampler modes, prompt logprobs, decode bursts) from abstract weights "
  "and KV pages, compiles them with libtpu for the chip's topology (tensor_parallel_size "
  "chips) and checks weights + KV pool + step transient + program code per chip against "
  f"the chip's HBM. Needs libtpu ({install_command(['tpu'])}), not a TPU.",
  add_flags=_flags,
  run=main,
)
