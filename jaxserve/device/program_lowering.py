"""A step program's lowering on padding inputs (device/program_compiler.py compiles the result).

`ProgramLowering(runner)` holds the runner's params and KV pages as abstract values
(jax.ShapeDtypeStructs), so lowering reads no buffer the engine donates and a compile thread never
touches them. `arguments(program)` is (jitted function, arguments, static arguments) of the
program's kind on its bucket's padding inputs (device/lowering.dummy_inputs): the forward, the
sampler on float32 logits [S, V], the prompt logprobs on hidden states [T, H] in the model's
dtype, or a decode burst; `lower(program)` lowers it and checks that a forward's hidden states
are [T, H] in the model's dtype. The program store keys a program by the abstract arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxserve.device.lowering import abstract, dummy_inputs
from jaxserve.device.model_runner import ModelRunner, packed_model_inputs
from jaxserve.device.packing import pack
from jaxserve.device.program_groups import Program


class ProgramLowering:
  """Lowers a runner's step programs on abstract params and KV pages."""

  def __init__(self, runner: ModelRunner):
    self.runner = runner
    self.params = abstract(runner.params)
    self.kv_pages = abstract(runner.kv_pages)

  def lower(self, program: Program) -> jax.stages.Lowered:
    jitted, args, static = self.arguments(program)
    lowered = jitted.lower(*args, *static)
    if program.kind == "forward":
      hidden, expected = lowered.out_info[2], self.hidden_state(program.bucket.num_tokens)
      if (hidden.shape, hidden.dtype) != (expected.shape, expected.dtype):
        raise ValueError(f"forward: hidden states {hidden}, expected {expected}")
    return lowered

  def hidden_state(self, num_tokens: int) -> jax.ShapeDtypeStruct:
    """The forward's hidden states [T, H] in the model's dtype (prompt logprobs' input)."""
    config = self.runner.model.config
    return jax.ShapeDtypeStruct((num_tokens, config.hidden_size), jnp.dtype(config.dtype))

  def arguments(self, program: Program) -> tuple[Callable, tuple, tuple]:
    """(jitted function, arguments, static arguments) the program is lowered on: padding inputs
    of its bucket, the params and KV pages abstract."""
    runner, programs = self.runner, self.runner.programs
    inputs = dummy_inputs(runner, program.bucket, program.mode, program.kind == "prompt")
    if program.kind == "forward":
      return programs.forward, (self.params, self.kv_pages, packed_model_inputs(inputs)), ()
    if program.kind == "sample":
      logits = jax.ShapeDtypeStruct(
        (program.bucket.num_seqs, runner.model.config.vocab_size), jnp.float32
      )
      args = (logits, pack(inputs.sampling), inputs.prev_sampled_ids)
      return programs.sample, args, (program.mode,)
    if program.kind == "prompt":
      hidden = self.hidden_state(program.bucket.num_tokens)
      return programs.prompt_logprobs, (self.params, hidden, inputs.prompt_target_ids), ()
    args = (self.params, self.kv_pages, packed_model_inputs(inputs), pack(inputs.sampling))
    return programs.burst, args, (program.mode,)
