"""Start-up costs of one engine configuration: weight loading (GB/s), the KV pool and warmup.

    jaxserve bench startup --model /data/llama8b --config configs/h100.yaml \
        --max-model-len 2048 --warmup full
    jaxserve bench startup --build llama-3.1-8b --model /data/llama8b --config ...
    python -m jaxserve.bench.bench_startup ...   # the same flags

--build NAME first writes a random checkpoint of that shape into --model (in a subprocess, so its
torch CUDA context is gone before jax starts) unless the directory already holds one. The client
memory fraction is set from the config before jax starts (jaxserve/device/device_memory.py), as
`jaxserve serve` does. Steps: the checkpoint files are read once (page cache warm, unless
--cold), the weights are loaded --load-runs times (each timed alone, arrays ready; a one-device
safetensors checkpoint once per memory layout per run, with the holes each leaves), then
`assembly.build_device` loads them once more and sizes the KV pool as the server would, then
(--warmup full) every bucket is compiled. Prints a short table and one JSON object (also written
to --out).
Imports nothing from jaxserve.server (runs without starlette/uvicorn).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from jaxserve.bench.flags import add_startup_flags, standalone_parser
from jaxserve.config.cli_args import engine_config_from_args
from jaxserve.device.platforms import prepare_jax_process
from jaxserve.runtime.log_setup import LOG_FORMAT
from jaxserve.tools.json_file import write_json
from jaxserve.tools.key_value_table import key_value_table

GIB = 2**30


def parse_args(argv=None) -> argparse.Namespace:
  parser = standalone_parser("bench_startup", __doc__)
  add_startup_flags(parser)
  return parser.parse_args(argv)


def build_checkpoint(shape: str, directory: str) -> None:
  if (Path(directory) / "config.json").is_file():
    return
  code = (
    "import sys; from jaxserve.bench.random_checkpoint import build_random_model; "
    "build_random_model(sys.argv[1], sys.argv[2])"
  )
  subprocess.run([sys.executable, "-c", code, shape, directory], check=True)


def read_files(directory: Path) -> dict:
  """Reads every safetensors file once (fills the page cache); the rate is the disk's or cache's."""
  files = sorted(directory.glob("*.safetensors"))
  start, total = time.perf_counter(), 0
  buffer = bytearray(64 << 20)
  for file in files:
    with open(file, "rb", buffering=0) as f:
      while n := f.readinto(buffer):
        total += n
  seconds = time.perf_counter() - start
  return {"bytes": total, "seconds": seconds, "gb_per_s": total / 1e9 / max(seconds, 1e-9)}


def time_weight_loads(config, runs: int) -> list[dict]:
  """Loads the weights `runs` times as the engine does (sharded when tensor-parallel); on one
  device a safetensors checkpoint is loaded in each memory layout in turn (packed, streaming),
  with what each leaves free: the allocator's largest free block and the holes beside it."""
  import jax

  from jaxserve.models.registry import load_model

  results = []
  layouts = ["packed", "streaming"] if _one_device_safetensors(config) else [None]
  for run in range(runs * len(layouts)):
    layout = layouts[run % len(layouts)]
    start = time.perf_counter()
    if config.tensor_parallel_size > 1:
      from jaxserve.parallel.partition_rules import build_mesh
      from jaxserve.parallel.sharded_loading import load_model_sharded

      mesh = build_mesh(config.tensor_parallel_size)
      params = load_model_sharded(
        config.model, config.dtype, mesh, tp_invariant_reductions=config.tp_invariant_reductions
      ).params
      source = config.model
    else:
      from jaxserve.models.weight_transfer import TransferOptions

      loaded = load_model(
        config.model,
        config.dtype,
        fuse_projections=config.fuse_projections,
        transfer=TransferOptions(layout=layout or "auto"),
      )
      params = loaded.params
      source = loaded.source if layout is None else f"safetensors, {layout} layout"
      del loaded
    num_bytes = sum(x.nbytes for x in jax.tree.leaves(jax.block_until_ready(params)))
    seconds = time.perf_counter() - start
    results.append(
      {
        "bytes": num_bytes,
        "seconds": seconds,
        "gb_per_s": num_bytes / 1e9 / seconds,
        "source": source,
        **_free_memory(),
      }
    )
    del params
    gc.collect()
  return results


def _one_device_safetensors(config) -> bool:
  from jaxserve.models.registry import PARAMS_SUBDIR

  model_dir = Path(config.model)
  return (
    config.tensor_parallel_size == 1
    and model_dir.is_dir()
    and not (model_dir / PARAMS_SUBDIR).is_dir()
  )


def _free_memory() -> dict:
  """The allocator's view now: bytes in use, its largest free block, and the free bytes outside
  that block (holes a pool allocated next could not use)."""
  from jaxserve.device.device_memory import read_device_memory

  memory = read_device_memory()
  if memory is None or memory.largest_free_bytes is None:
    return {}
  free = memory.limit_bytes - memory.in_use_bytes
  return {
    "in_use_gib": memory.in_use_bytes / GIB,
    "largest_free_gib": memory.largest_free_bytes / GIB,
    "holes_gib": (free - memory.largest_free_bytes) / GIB,
  }


def time_host_converted_load(config) -> dict:
  """The --baseline: each tensor transposed / cast on the host (load_hf_params' `put` path),
  then jax.device_put."""
  import jax

  from jaxserve.models.weights import load_hf_config, load_hf_params

  model_config = load_hf_config(Path(config.model), config.dtype)
  start = time.perf_counter()
  params = load_hf_params(
    Path(config.model),
    model_config,
    put=lambda path, array: jax.device_put(array).block_until_ready(),
  )
  num_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  seconds = time.perf_counter() - start
  del params
  gc.collect()
  return {"bytes": num_bytes, "seconds": seconds, "gb_per_s": num_bytes / 1e9 / seconds}


def device_stats() -> dict:
  import jax

  from jaxserve.device.device_memory import read_device_memory

  memory = read_device_memory()
  device = jax.devices()[0]
  out = {
    "device": device.device_kind,
    "platform": device.platform,
    "num_devices": jax.device_count(),
  }
  if memory is not None:
    out.update(
      total_gib=memory.total_bytes / GIB,
      client_limit_gib=memory.limit_bytes / GIB,
      in_use_gib=memory.in_use_bytes / GIB,
    )
  return out


def main(argv=None) -> int:
  return command(parse_args(argv))


def command(args: argparse.Namespace) -> int:
  """The benchmark on parsed flags (`jaxserve bench startup` calls it)."""
  logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
  if args.build:
    if not args.model:
      raise SystemExit("--build needs --model DIR (where to write the checkpoint)")
    build_checkpoint(args.build, args.model)
  config = engine_config_from_args(args)
  setup = prepare_jax_process(config.cache.memory_fraction)  # before jax starts
  import jax

  from jaxserve.composition.assembly import build_device
  from jaxserve.device.device_memory import max_concurrency
  from jaxserve.device.warmup import warmup

  report: dict = {
    "model": config.model,
    "memory_fraction": config.cache.memory_fraction,
    "client_env": dict(setup.set_vars) or dict(setup.user_vars),
    "jax": jax.__version__,
  }
  model_dir = Path(config.model)
  if model_dir.is_dir() and not args.cold:
    report["page_cache_fill"] = read_files(model_dir)
  if args.baseline and model_dir.is_dir() and config.tensor_parallel_size == 1:
    report["baseline_host_converted"] = time_host_converted_load(config)
  report["weight_loads"] = time_weight_loads(config, args.load_runs)
  start = time.perf_counter()
  built = build_device(config)
  jax.block_until_ready(built.runner.kv_pages)
  spec = built.spec
  report["build_device_s"] = time.perf_counter() - start
  report["kv_pool"] = {
    "gib": spec.total_bytes / GIB,
    "num_pages": spec.num_pages,
    "page_size": spec.page_size,
    "max_model_len": built.max_model_len,
    "max_concurrency": max_concurrency(spec.num_pages, spec.page_size, built.max_model_len),
  }
  report["device_memory_after_pool"] = device_stats()
  if args.warmup == "full":  # the engine flag: here "also compile every bucket (timed)"
    report["warmup_s"] = warmup(built.runner, show_progress=False)
  print(format_table(report))
  if args.out:
    write_json(args.out, report)
  print(json.dumps(report))
  return 0


def format_table(report: dict) -> str:
  pool, device = report["kv_pool"], report["device_memory_after_pool"]
  rows = [
    ("device", f"{device['device']} x{device['num_devices']} (jax {report['jax']})"),
    ("client env", json.dumps(report["client_env"]) or "-"),
  ]
  if "page_cache_fill" in report:
    fill = report["page_cache_fill"]
    rows.append(
      (
        "read checkpoint files",
        f"{fill['bytes'] / 1e9:.1f} GB in {fill['seconds']:.1f} s ({fill['gb_per_s']:.2f} GB/s)",
      )
    )
  if "baseline_host_converted" in report:
    base = report["baseline_host_converted"]
    rows.append(
      (
        "weights, host-converted (before)",
        f"{base['bytes'] / 1e9:.1f} GB in {base['seconds']:.1f} s ({base['gb_per_s']:.2f} GB/s)",
      )
    )
  rows += [
    (
      f"weights, load {i + 1}",
      f"{r['bytes'] / 1e9:.1f} GB in {r['seconds']:.1f} s "
      f"({r['gb_per_s']:.2f} GB/s; {r['source']})"
      + (
        f"; {r['in_use_gib']:.2f} GiB in use, largest free block "
        f"{r['largest_free_gib']:.2f} GiB, holes {r['holes_gib']:.2f} GiB"
        if "holes_gib" in r
        else ""
      ),
    )
    for i, r in enumerate(report["weight_loads"])
  ]
  if report["weight_loads"]:
    best = max(report["weight_loads"], key=lambda r: r["gb_per_s"])
    rows.append(("best weight load", f"{best['gb_per_s']:.2f} GB/s ({best['source']})"))
  rows += [
    ("build_device (load + pool)", f"{report['build_device_s']:.1f} s"),
    ("KV pool", f"{pool['gib']:.1f} GiB, {pool['num_pages']} pages of {pool['page_size']}"),
    (f"max concurrency at {pool['max_model_len']} tokens", f"{pool['max_concurrency']:.2f}x"),
  ]
  if "total_gib" in device:
    rows.append(
      (
        "device memory",
        f"total {device['total_gib']:.1f} GiB, client limit "
        f"{device['client_limit_gib']:.1f} GiB, in use {device['in_use_gib']:.1f} GiB",
      )
    )
  if "warmup_s" in report:
    rows.append(("warmup", f"{report['warmup_s']:.1f} s"))
  return key_value_table(rows)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  sys.exit(main())
