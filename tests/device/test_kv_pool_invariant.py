"""The KV pool's page count is a function of run-invariant quantities (total memory, the client's
limit, the weights' bytes from their shapes, the measured step scratch), not of the allocator's
live state: two builds whose weight loader left different amounts in use and different largest
free blocks (as the loader's threads do on a GPU) get the same pool, so the forward programs'
shapes, and their compilation-cache keys, are the same at every restart."""

from __future__ import annotations

import logging
import re

import jax
import jax.numpy as jnp
import pytest

from jaxserve.bench.bench_server_startup import LOG_FACTS
from jaxserve.composition import assembly, pool_sizing
from jaxserve.config.loader import load_config
from jaxserve.device import device_memory as dm
from jaxserve.device.device_memory import (
  DeviceMemory,
  fit_pool_bytes,
  kv_pool_bytes,
  planned_memory,
)

GIB = 2**30


def test_planned_pool_ignores_the_live_counts():
  # 80 GiB card, 72 GiB arena, 15 GiB of weights (+25% loader slack = 3.75 GiB), headroom 2%
  # of 72 GiB: 72 - 18.75 - 1.44 GiB, whatever the loader left in use or in holes.
  runs = [
    DeviceMemory(80 * GIB, 72 * GIB, int(15.64 * GIB), int(53.6 * GIB)),
    DeviceMemory(80 * GIB, 72 * GIB, int(15.73 * GIB), int(54.0 * GIB)),
  ]
  expected = 72 * GIB - 15 * GIB - int(3.75 * GIB) - int(0.02 * 72 * GIB)
  for live in runs:
    planned = kv_pool_bytes(planned_memory(live, 15 * GIB), 0.9)
    assert planned == expected
    scratch = GIB // 2
    assert fit_pool_bytes(planned - scratch, live.largest_free_bytes, scratch) == planned - scratch


def test_a_pool_that_does_not_fit_shrinks_by_64ths(caplog):
  # largest free block 52 GiB, less 0.5 GiB scratch and 0.5 GiB headroom: room for 51 GiB; a
  # 64 GiB plan shrinks by 13 steps of 1 GiB
  caplog.set_level(logging.WARNING)  # whatever level an earlier test left the root logger at
  assert fit_pool_bytes(64 * GIB, 52 * GIB, GIB // 2) == 51 * GIB
  assert fit_pool_bytes(64 * GIB, int(52.9 * GIB), GIB // 2) == 51 * GIB
  assert "does not fit the largest free block" in caplog.text
  assert fit_pool_bytes(int(51.3 * GIB), None, GIB // 2) == int(51.3 * GIB)  # CPU: no stats


def test_weight_bytes_come_from_shapes_and_shardings():
  params = {"a": jnp.zeros((4, 8), jnp.bfloat16), "b": {"c": jnp.zeros((3,), jnp.float32)}}
  assert pool_sizing.device_weight_bytes(params) == 4 * 8 * 2 + 3 * 4
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params
  )
  assert pool_sizing.device_weight_bytes(abstract) == 4 * 8 * 2 + 3 * 4


@pytest.mark.parametrize("fraction", [0.2])
def test_two_builds_with_different_live_memory_get_the_same_pages(monkeypatch, fraction):
  config = load_config(
    None,
    [
      f"cache.memory_fraction={fraction}",
      "max_model_len=64",
      "scheduler.max_num_seqs=8",
      "scheduler.max_num_batched_tokens=32",
      "scheduler.seq_buckets=[8]",
      "scheduler.token_buckets=[32]",
      "compilation_cache_dir=null",
    ],
  )
  pages = []
  # a GPU-like device of 4 GiB at fraction 0.2 (0.8 GiB usable, 0.5 GiB of it headroom); the two
  # "loader timings" leave different live counts and largest free blocks
  for in_use, largest in ((3 << 20, 1500 << 20), (40 << 20, 1200 << 20)):
    live = DeviceMemory(4 * GIB, int(3.6 * GIB), in_use, largest)
    monkeypatch.setattr(dm, "read_device_memory", lambda environ=None, live=live: live)
    pages.append(assembly.build_device(config).spec.num_pages)
  assert pages[0] == pages[1]
  # a third whose largest free block is too small shrinks (by 64ths of the planned pool)
  live = DeviceMemory(4 * GIB, int(3.6 * GIB), 3 << 20, 700 << 20)
  monkeypatch.setattr(dm, "read_device_memory", lambda environ=None: live)
  assert assembly.build_device(config).spec.num_pages < pages[0]


def test_packed_weights_leave_the_pool_what_the_loader_no_longer_wastes():
  # 15 GiB of weights: 25% slack streamed (holes measured at 26-29% on an H100), 1% packed
  memory = DeviceMemory(80 * GIB, 72 * GIB, 0)
  streamed = kv_pool_bytes(planned_memory(memory, 15 * GIB), 0.9)
  packed = kv_pool_bytes(planned_memory(memory, 15 * GIB, packed=True), 0.9)
  assert packed - streamed == int(3.75 * GIB) - int(0.15 * GIB)


def test_a_moe_packed_in_groups_is_charged_the_packed_slack(monkeypatch, caplog):
  """Qwen3-30B-A3B's 56.88 GiB of bf16 weights on an H200 at 0.9: too large to pack at once, it
  was streamed and charged 25% (14.22 GiB); packed in groups it leaves no holes and is charged
  1%, and the pool gets the difference. The accounting line keeps the format the start-up
  benchmark parses."""
  weights = int(56.88 * GIB)
  memory = DeviceMemory(int(139.8 * GIB), int(0.9 * 139.8 * GIB), 0)
  monkeypatch.setattr(dm, "read_device_memory", lambda environ=None: memory)
  caplog.set_level(logging.INFO, logger=dm.__name__)
  streamed, _ = dm.kv_budget_bytes(0.9, weights)
  caplog.clear()
  packed, _ = dm.kv_budget_bytes(0.9, weights, packed=True)
  assert packed - streamed == int(0.25 * weights) - int(0.01 * weights)
  assert 65 * GIB < packed < 66 * GIB  # 52.2 GiB streamed
  line = next(r.getMessage() for r in caplog.records if "loader slack" in r.getMessage())
  assert re.search(LOG_FACTS["kv_budget"], line).group(1).startswith("139.8 GiB total x 0.9")
  assert "56.88 GiB of weights + 0.57 GiB loader slack" in line
