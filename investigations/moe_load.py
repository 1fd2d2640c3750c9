"""One weight load of a safetensors checkpoint as a one-device engine does it (projections fused,
the "auto" layout unless --layout says otherwise, the client's arena set to --memory-fraction),
measured with the allocator's statistics: the layout the loader chose (streaming, packed, or
packed in N groups: models/packed_layout.py), the load's seconds, the bytes in use after it
against the weights' own bytes (from their shapes and dtypes), the largest free block and the
free bytes outside it (holes), the peak bytes in use during the load, the loader slack the KV pool
sizing charges for that layout and the pool it plans (device/device_memory.py, whose accounting
line is logged too), and whether that pool, allocated as one buffer per layer for K and for V,
fits the arena the load left. A device without memory statistics (the CPU) reports the layout,
seconds and weights only.

    python -m investigations.moe_load --model /tmp/qwen3moe --out moe_load.json

prints a short table and writes it as JSON to --out; one load a process (a fresh arena).
"""

from __future__ import annotations

import argparse
import logging
import time

from jaxserve.device.platforms import prepare_jax_process
from jaxserve.tools.json_file import write_json

GIB = 1 << 30


def layout_name(groups: int) -> str:
  return "streaming" if groups == 0 else "packed" if groups == 1 else f"packed in {groups} groups"


def measure(model: str, layout: str, fraction: float, fuse: bool, group_bytes: int | None) -> dict:
  import jax

  from jaxserve.composition.pool_sizing import device_weight_bytes
  from jaxserve.device.device_memory import (
    fit_pool_bytes,
    kv_budget_bytes,
    loader_slack,
    read_device_memory,
  )
  from jaxserve.models.weight_transfer import TransferOptions
  from jaxserve.models.weights import load_hf_config, load_hf_weights
  from jaxserve.runtime.memory_stats import memory_stats

  config = load_hf_config(model)
  before = read_device_memory()
  start = time.perf_counter()
  options = TransferOptions(layout=layout, group_bytes=group_bytes)
  params, stats = load_hf_weights(model, config, fuse=fuse, options=options)
  jax.block_until_ready(params)
  seconds = time.perf_counter() - start
  weight_bytes = device_weight_bytes(params)
  result = {
    "layout": layout_name(stats.groups),
    "load_s": seconds,
    "checkpoint_bytes": stats.num_bytes,
    "weight_bytes": weight_bytes,
    "loader_slack_bytes": loader_slack(weight_bytes, stats.packed),
  }
  after = read_device_memory()
  if after is None or before is None:
    return result
  peak = (memory_stats(jax.devices()[0]) or {}).get("peak_bytes_in_use")
  free = after.limit_bytes - after.in_use_bytes
  result |= {
    "limit_bytes": after.limit_bytes,
    "in_use_before_bytes": before.in_use_bytes,
    "in_use_bytes": after.in_use_bytes,
    "peak_in_use_bytes": None if peak is None else int(peak),
    "largest_free_bytes": after.largest_free_bytes,
    "holes_bytes": None if after.largest_free_bytes is None else free - after.largest_free_bytes,
  }
  planned = kv_budget_bytes(fraction, weight_bytes, packed=stats.packed)
  if planned is not None:
    budget = planned[0]
    result["kv_pool_bytes"] = budget
    result["kv_pool_fitted_bytes"] = fit_pool_bytes(budget, after.largest_free_bytes, 0)
    result["kv_pool_allocated"] = allocate_pool(result["kv_pool_fitted_bytes"], config.num_layers)
  return result


def allocate_pool(pool_bytes: int, num_layers: int) -> bool:
  """Whether `pool_bytes` allocate as one buffer per layer for K and one for V (the KV pool's
  shape in memory); freed again."""
  import jax
  import jax.numpy as jnp

  size = pool_bytes // (2 * num_layers)
  zeros = jax.jit(lambda: jnp.zeros((size,), jnp.uint8))
  buffers = []
  try:
    for _ in range(2 * num_layers):
      buffers.append(jax.block_until_ready(zeros()))
    return True
  except jax.errors.JaxRuntimeError as err:  # RESOURCE_EXHAUSTED
    logging.getLogger(__name__).warning("the planned KV pool does not allocate: %s", err)
    return False
  finally:
    for buffer in buffers:
      buffer.delete()


def _gib(value: int | None) -> str:
  return "n/a" if value is None else f"{value / GIB:.2f} GiB"


def table(result: dict) -> str:
  rows = [
    ("layout", result["layout"]),
    ("load", f"{result['load_s']:.1f} s ({result['checkpoint_bytes'] / 1e9:.1f} GB read)"),
    ("weights", _gib(result["weight_bytes"])),
    ("in use after load", _gib(result.get("in_use_bytes"))),
    ("in use beyond the weights", _in_use_beyond(result)),
    ("peak in use during load", _gib(result.get("peak_in_use_bytes"))),
    ("largest free block", _gib(result.get("largest_free_bytes"))),
    ("holes (free outside it)", _gib(result.get("holes_bytes"))),
    ("loader slack charged", _gib(result["loader_slack_bytes"])),
    ("KV pool planned", _gib(result.get("kv_pool_bytes"))),
    ("KV pool fitted", _gib(result.get("kv_pool_fitted_bytes"))),
    ("KV pool allocates", str(result.get("kv_pool_allocated", "n/a"))),
  ]
  return "\n".join(f"{name:<26} {value}" for name, value in rows)


def _in_use_beyond(result: dict) -> str:
  if "in_use_bytes" not in result:
    return "n/a"
  beyond = result["in_use_bytes"] - result["in_use_before_bytes"] - result["weight_bytes"]
  return _gib(beyond)


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", required=True, help="a safetensors checkpoint directory")
  parser.add_argument("--layout", default="auto", choices=("auto", "packed", "streaming"))
  parser.add_argument("--memory-fraction", type=float, default=0.9)
  parser.add_argument("--no-fuse", action="store_true", help="keep q/k/v and gate/up apart")
  parser.add_argument("--group-bytes", type=int, default=None, help="packed: bytes per group")
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
  prepare_jax_process(args.memory_fraction)  # before jax starts a backend
  result = measure(
    args.model, args.layout, args.memory_fraction, not args.no_fuse, args.group_bytes
  )
  print(table(result))
  if args.out:
    write_json(args.out, result)
  return result


if __name__ == "__main__":
  main()
