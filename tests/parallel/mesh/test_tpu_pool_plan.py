"""compile-tpu sizes the KV pool as the engine does on a TPU chip: a tp = 2 engine built on a
device that reports TPU-like memory statistics (bytes_limit = the whole device, no largest free
block) gets exactly the page count tpu_aot.step_programs.pool_pages plans for that chip, loader
slack, headroom and unmeasured scratch included, so the programs compile-tpu writes are the ones
the server looks up."""

from __future__ import annotations

import dataclasses

import jax

from jaxserve.composition import assembly
from jaxserve.config import CacheConfig
from jaxserve.device import device_memory as dm
from jaxserve.device.device_memory import DeviceMemory
from jaxserve.models.weights import load_hf_config
from jaxserve.tpu_aot.step_programs import pool_pages, server_shape
from tests.integration.engine_helpers import small_config

MIB = 2**20


def test_engine_and_tpu_plan_agree_on_the_pool(hf_checkpoint, monkeypatch):
  checkpoint = hf_checkpoint("llama_kv8")
  config = small_config(
    str(checkpoint),
    tensor_parallel_size=2,
    max_model_len=128,
    max_num_seqs=8,
    max_tokens_per_step=32,
    seq_buckets=(8,),
    token_buckets=(16, 32),
    prefix_caching=False,
    attention_backend="xla",
  )
  config = dataclasses.replace(config, cache=CacheConfig(page_size=16, memory_fraction=0.2))
  chip_bytes = 4 * 1024 * MIB
  # 0.8 GiB usable, 0.5 GiB of it headroom; the live count is one the plan ignores
  chip = DeviceMemory(chip_bytes, chip_bytes, 3 * MIB, None)
  monkeypatch.setattr(dm, "read_device_memory", lambda environ=None: chip)
  engine_pages = assembly.build_device(config).spec.num_pages
  shape = server_shape(config, load_hf_config(checkpoint), jax.devices()[:2])
  assert engine_pages == pool_pages(shape, chip_bytes) > 2
