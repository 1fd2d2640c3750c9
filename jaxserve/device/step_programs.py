"""The one builder of an engine step's device programs: build_step_programs(model, shardings).

It jits the functions of device/step_fns.py (forward, sampler, prompt logprobs and, with
burst_steps > 1, the decode burst) once, with explicit shardings when the model is laid out over
a mesh, and returns them as StepPrograms. The ModelRunner runs them; warmup and ahead-of-time
lowering (device/lowering.py, device/warmup.py) lower them. Nothing here reads a config or a
mesh: the caller (jaxserve/composition/assembly.py) hands in the model, the shardings and the XLA
options, so the same builder serves one device, a tensor-parallel mesh, a multi-host job, and
ahead-of-time compilation for a topology this machine does not have (`jax.ShapeDtypeStruct`
arguments with `.sharding` set, then `programs.forward.lower(...)`).

Shardings (StepShardings): the params' and KV pages' own, the logits sharded as the output
projection leaves them (the sampler's reductions over the vocabulary gather what they need), and
everything else replicated, so every host can read the sampled ids. The KV pages come back with
the very sharding they came in with, so the donated buffers are updated in place.

A model with tp_invariant_reductions is compiled with XLA's excess precision off: otherwise XLA
may skip a bfloat16 rounding between two ops wherever it fuses them, and the sharded program
(collectives, shard_map boundaries) fuses differently from the unsharded one. On GPUs its GEMMs
also run on cuBLAS with the library's own algorithm choice (no Triton GEMM fusions, no
timing-based autotuning), so a GEMM of a given shape runs the same algorithm in every compilation.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxserve.device.sampler import GreedyFn, xla_greedy
from jaxserve.device.step_fns import (
  make_burst_fn,
  make_forward_fn,
  make_prompt_logprobs_fn,
  sample_step,
)

INVARIANT_COMPILER_OPTIONS = {
  "xla_allow_excess_precision": False,
  "xla_gpu_enable_triton_gemm": False,
  "xla_gpu_autotune_level": 0,
}

CompilerOptions = Mapping[str, object]


@dataclass(frozen=True)
class StepShardings:
  """Where a step's arrays live on a mesh."""

  params: dict  # the params' tree of jax.sharding.Sharding
  kv_pages: tuple  # per pool group (k_pool, v_pool) jax.sharding.Sharding
  logits: jax.sharding.Sharding  # f32[S, V]
  replicated: jax.sharding.Sharding  # step inputs, sampled outputs, constants


@dataclass(frozen=True)
class StepPrograms:
  """The jitted programs of one engine step (signatures in device/step_fns.py)."""

  forward: jax.stages.Wrapped  # (params, kv_pages, packed inputs) -> (kv, logits, hidden)
  sample: jax.stages.Wrapped  # (logits, packed sampling, prev ids, mode) -> (out, ids)
  prompt_logprobs: jax.stages.Wrapped  # (params, hidden, target ids) -> (logprob, top ids, top)
  burst: jax.stages.Wrapped | None  # (params, kv_pages, packed, packed sampling, mode) -> ...
  burst_steps: int  # decode steps per burst dispatch (1: no bursts)
  shardings: StepShardings | None  # None: one device, default placement

  def filled(self, shape: tuple[int, ...], dtype: np.dtype, value: int) -> jax.Array:
    """A filled device array laid out as the step inputs are (each process filling its own
    devices on a mesh)."""
    if self.shardings is None:
      return jnp.full(shape, value, dtype)
    return constant_array(shape, dtype, value, self.shardings.replicated)


def constant_array(
  shape: tuple[int, ...], dtype: np.dtype, value: int, sharding: jax.sharding.Sharding
) -> jax.Array:
  """A filled array laid out by `sharding`, each process filling its own devices (unlike
  device_put onto a multi-host sharding, no cross-host exchange happens)."""
  return jax.make_array_from_callback(
    shape, sharding, lambda index: np.full(shape, value, dtype)[index]
  )


def build_step_programs(
  model: nn.Module,
  shardings: StepShardings | None = None,
  *,
  burst_steps: int = 1,
  page_size: int | None = None,
  greedy: GreedyFn = xla_greedy,
  compiler_options: CompilerOptions | None = None,
) -> StepPrograms:
  """The step programs of `model` (a LlamaForCausalLM-like flax module), jitted with
  `shardings` when given. burst_steps > 1 adds the decode-burst program, which needs the KV
  page_size. greedy is the sampler's greedy pick and log-normalizer."""
  if burst_steps < 1:
    raise ValueError(f"burst_steps: must be at least 1, got {burst_steps}")
  if burst_steps > 1 and page_size is None:
    raise ValueError("page_size: a decode burst needs the KV page size")
  options = dict(compiler_options or {})
  if model.config.tp_invariant_reductions:
    options.update(INVARIANT_COMPILER_OPTIONS)
  jit = functools.partial(jax.jit, compiler_options=options or None)
  placed = _placements(shardings)
  forward = jit(make_forward_fn(model), donate_argnums=(1,), **placed["forward"])
  sample = jit(
    functools.partial(sample_step, greedy=greedy), static_argnums=(3,), **placed["sample"]
  )
  prompt = jit(make_prompt_logprobs_fn(model), **placed["prompt"])
  burst = None
  if burst_steps > 1:
    burst = jit(
      make_burst_fn(model, burst_steps, page_size, greedy),
      donate_argnums=(1,),
      static_argnums=(4,),
      **placed["burst"],
    )
  return StepPrograms(forward, sample, prompt, burst, burst_steps, shardings)


def _placements(shardings: StepShardings | None) -> dict[str, dict[str, tuple]]:
  """jax.jit's in/out shardings of each program (none on one device: default placement)."""
  if shardings is None:
    return {"forward": {}, "sample": {}, "prompt": {}, "burst": {}}
  params, kv, logits, rep = (
    shardings.params,
    shardings.kv_pages,
    shardings.logits,
    shardings.replicated,
  )
  return {
    "forward": {"in_shardings": (params, kv, rep), "out_shardings": (kv, logits, rep)},
    "sample": {"in_shardings": (logits, rep, rep), "out_shardings": rep},
    "prompt": {"in_shardings": (params, rep, rep), "out_shardings": rep},
    "burst": {"in_shardings": (params, kv, rep, rep), "out_shardings": (kv, rep, rep, rep)},
  }
