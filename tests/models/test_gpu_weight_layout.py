"""On a GPU: the packed layout (models/weight_transfer.py) leaves no hole between the weights,
where loading tensor by tensor does. Measured with the allocator's own statistics: after a load,
the free bytes outside its largest free block (holes) must not have grown by more than 1 MiB.
A float32 checkpoint of 1024-wide layers (about 0.5 GB) is written here with safetensors' numpy
writer. Skipped where JAX has no GPU (the CPU reports no allocator statistics)."""
from __future__ import annotations

import gc

import jax
import numpy as np
import pytest
import safetensors.numpy

from jaxserve.device.device_memory import read_device_memory
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.weight_transfer import TransferOptions
from jaxserve.models.weights import hf_tensor_specs, load_hf_weights

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")

MIB = 2**20
CONFIG = ModelConfig(architecture="llama", vocab_size=32000, hidden_size=1024,
                     intermediate_size=3584, num_layers=8, num_q_heads=16, num_kv_heads=4,
                     head_dim=64, dtype="float32")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  directory = tmp_path_factory.mktemp("layout")
  rng = np.random.default_rng(0)
  tensors = {spec.hf_name: rng.standard_normal(spec.hf_shape, dtype=np.float32)
             for spec in hf_tensor_specs(CONFIG)}
  safetensors.numpy.save_file(tensors, str(directory / "model.safetensors"))
  return directory


def _holes() -> int:
  memory = read_device_memory()
  return memory.limit_bytes - memory.in_use_bytes - memory.largest_free_bytes


def _load_and_measure(checkpoint, layout: str, fuse: bool) -> tuple[int, bool]:
  gc.collect()
  before = _holes()
  params, stats = load_hf_weights(checkpoint, CONFIG, fuse=fuse,
                                  options=TransferOptions(layout=layout))
  holes = _holes() - before
  del params
  gc.collect()
  return holes, stats.packed


@pytest.mark.parametrize("fuse", [False, True])
def test_packed_layout_leaves_no_holes(checkpoint, fuse):
  packed_holes, packed = _load_and_measure(checkpoint, "auto", fuse)
  streamed_holes, _ = _load_and_measure(checkpoint, "streaming", fuse)
  print(f"holes: packed {packed_holes / MIB:.1f} MiB, streamed {streamed_holes / MIB:.1f} MiB")
  assert packed  # "auto" packs where the weights fit twice
  assert packed_holes <= MIB
