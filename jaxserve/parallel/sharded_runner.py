"""The model runner of a sharded engine: the same step functions, jitted with explicit shardings.

in_shardings are the params' own shardings (from the partition rules), the KV pages' kv-head
sharding and replicated step inputs; out_shardings give the new pages the very sharding they came
in with, so the donated buffers are updated in place, keep the logits sharded as the output
projection leaves them (the sampler's reductions over the vocabulary gather what they need), and
replicate the sampled outputs so every host can read them. On a multi-host job process 0's runner publishes each step's inputs to the
other hosts right before running it (`publisher`), which also covers warmup; close() releases
them once serving ends.

A model with tp_invariant_reductions is compiled with XLA's excess precision off: otherwise XLA
may skip a bfloat16 rounding between two ops wherever it fuses them, and the sharded program
(collectives, shard_map boundaries) fuses differently from the unsharded one. On GPUs its GEMMs
also run on cuBLAS with the library's own algorithm choice (no Triton GEMM fusions, no timing-based
autotuning), so a GEMM of a given shape runs the same algorithm in every compilation. The factory
runs such a model through this runner at every tensor_parallel_size, tp = 1 included.
"""
from __future__ import annotations

from typing import Protocol

import jax
import numpy as np
from jax.sharding import Mesh

from jaxserve.device.buckets import BucketSet
from jaxserve.device.kv_cache import KVPages
from jaxserve.device.model_runner import ModelRunner, StepHandle
from jaxserve.device.step_fns import make_forward_fn, make_prompt_logprobs_fn, sample_step
from jaxserve.device.step_inputs import StepInputs, StepShape
from jaxserve.parallel.partition_rules import logits_sharding, replicated

INVARIANT_COMPILER_OPTIONS = {"xla_allow_excess_precision": False,
                              "xla_gpu_enable_triton_gemm": False, "xla_gpu_autotune_level": 0}


def constant_array(shape: tuple[int, ...], dtype: np.dtype, value: int,
                   sharding: jax.sharding.Sharding) -> jax.Array:
  """A filled array laid out by `sharding`, each process filling its own devices (unlike
  device_put onto a multi-host sharding, no cross-host exchange happens)."""
  return jax.make_array_from_callback(shape, sharding,
                                      lambda index: np.full(shape, value, dtype)[index])


class StepSink(Protocol):
  """Where process 0 sends each step before running it (multihost.StepPublisher)."""

  def publish(self, inputs: StepInputs) -> None: ...

  def stop(self) -> None: ...


class ShardedModelRunner(ModelRunner):
  """ModelRunner over a mesh; `publisher.publish(inputs)` runs before every step when given."""

  def __init__(self, model, params: dict, kv_pages: KVPages, buckets: BucketSet,
               shape: StepShape, mesh: Mesh, publisher: StepSink | None = None,
               compiler_options: dict[str, object] | None = None):
    super().__init__(model, params, kv_pages, buckets, shape, compiler_options)
    self.mesh = mesh
    self.replicated = replicated(mesh)
    self.publisher = publisher
    param_shardings = jax.tree.map(lambda x: x.sharding, params)
    kv_shardings = jax.tree.map(lambda x: x.sharding, kv_pages)
    logits = logits_sharding(params, mesh)
    options = compiler_options
    if model.config.tp_invariant_reductions:
      options = {**(compiler_options or {}), **INVARIANT_COMPILER_OPTIONS}
    rep = self.replicated
    self._forward = jax.jit(make_forward_fn(model), donate_argnums=(1,),
                            in_shardings=(param_shardings, kv_shardings, rep),
                            out_shardings=(kv_shardings, logits, rep), compiler_options=options)
    self._sample = jax.jit(sample_step, static_argnums=(3,),
                           in_shardings=(logits, rep, rep), out_shardings=rep,
                           compiler_options=options)
    self._prompt = jax.jit(make_prompt_logprobs_fn(model),
                           in_shardings=(param_shardings, rep, rep), out_shardings=rep,
                           compiler_options=options)
    self._burst_shardings = (param_shardings, kv_shardings, options)

  def set_burst_steps(self, num_steps: int) -> None:
    if num_steps > 1 and self.publisher is not None:
      raise ValueError("scheduler.num_scheduler_steps: decode bursts do not run on multi-host "
                       "jobs (the other hosts replay single steps); set it to 1")
    super().set_burst_steps(num_steps)

  def jit_burst(self, burst_fn):
    params, kv_pages, options = self._burst_shardings
    rep = self.replicated
    return jax.jit(burst_fn, donate_argnums=(1,), static_argnums=(4,),
                   in_shardings=(params, kv_pages, rep, rep),
                   out_shardings=(kv_pages, rep, rep, rep), compiler_options=options)

  @property
  def supports_async(self) -> bool:
    """The other hosts of a multi-host job replay each step from its published inputs, which
    cannot carry the previous step's device output: they run steps synchronously."""
    return self.publisher is None

  def filled_array(self, shape: tuple[int, ...], dtype: np.dtype, value: int) -> jax.Array:
    """Replicated over the mesh, each process filling its own devices."""
    return constant_array(shape, dtype, value, self.replicated)

  def dispatch(self, inputs: StepInputs, num_steps: int = 1) -> StepHandle:
    if self.publisher is not None:
      self.publisher.publish(inputs)
    return super().dispatch(inputs, num_steps)

  def close(self) -> None:
    """Ends the other hosts' step loops (no-op on one host)."""
    if self.publisher is not None:
      self.publisher.stop()
      self.publisher = None
