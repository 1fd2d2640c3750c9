"""The step programs' compile threads (config key compile_threads, device/program_compiler.py):
which buckets are ready before the engine serves, that a one-sequence decode then runs in its
own bucket rather than padded to the largest, and that a program XLA fails to compile stops the
compilation with the program's name (on the caller's thread and on the compile threads alike)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.device.program_compiler import ProgramCompileError, ProgramCompiler
from jaxserve.device.program_groups import Program
from jaxserve.messages.buckets import Bucket
from tests.integration.engine_helpers import run_to_completion, small_engine
from tests.integration.test_background_compile import CONFIG  # the same small ladder

LARGEST, SMALLEST_DECODE = Bucket(8, 64), Bucket(2, 8)


def _fails_to_compile() -> jax.stages.Lowered:
  """A real program XLA refuses: a call to a foreign function no one registered."""

  def f(x):
    return jax.ffi.ffi_call("jaxserve_no_such_target", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

  return jax.jit(f).lower(jnp.zeros(3))


def test_one_thread_starts_with_the_largest_bucket_alone():
  engine = small_engine(warmup="full", compile_threads=1, **CONFIG)
  compiler = ProgramCompiler(engine.runner, threads=1)
  assert compiler.num_first_groups() == 1 and compiler.groups[0].steps == {LARGEST}
  assert ProgramCompiler(engine.runner, threads=2).num_first_groups() == 2
  assert compiler.groups[1].steps == {SMALLEST_DECODE}  # decode buckets, smallest first
  with pytest.raises(ValueError, match="compile_threads"):
    ProgramCompiler(engine.runner, threads=0)


def test_a_single_stream_decodes_in_the_smallest_bucket_from_the_first_request():
  engine = small_engine(warmup="background", compile_threads=2, **CONFIG)
  ready_at_start = engine.programs.readiness().steps
  assert {LARGEST, SMALLEST_DECODE} <= ready_at_start  # compiled before the engine served
  engine.programs.close(wait_s=60)  # nothing more compiles (a loaded machine may have finished
  ready = engine.programs.readiness().steps  # a group in the meantime: serve with what is ready)
  engine.add_request(list(range(1, 30)), SamplingParams(max_tokens=12, ignore_eos=True), "one")
  done = run_to_completion(engine)
  assert len(done["one"].token_ids) == 12
  per_bucket = engine.timings.per_bucket
  # the 29-token prompt runs in the smallest ready bucket of >= 29 tokens (the largest when only
  # the first groups are ready); every decode step then fits 2 x 8
  prompt_bucket = min((b for b in ready if b.num_tokens >= 29), key=lambda b: b.num_tokens)
  assert per_bucket[(2, 8)][0] >= 10, per_bucket
  assert per_bucket[(prompt_bucket.num_seqs, prompt_bucket.num_tokens)][0] <= 2, per_bucket
  engine.ledger.close()


def test_a_program_that_fails_to_compile_is_named():
  engine = small_engine(warmup="lazy", **CONFIG)
  real = ProgramCompiler(engine.runner)
  broken = real.groups[3].programs[1]  # the second program of the fourth group

  def lower(program: Program) -> jax.stages.Lowered:
    return _fails_to_compile() if program == broken else jax.jit(lambda: 0).lower()

  compiler = ProgramCompiler(engine.runner, threads=3, lower=lower)
  compiler.compile_first()
  with pytest.raises(ProgramCompileError, match="jaxserve_no_such_target") as failed:
    compiler.compile_rest()
  assert failed.value.program == broken and broken.describe() in str(failed.value)
  assert str(failed.value).startswith(f"compiling the {broken.kind} program of bucket (")
  assert set(real.groups[3].steps).isdisjoint(compiler.readiness().steps)
  assert not compiler.readiness().complete

  first_fails = ProgramCompiler(engine.runner, threads=2, lower=lambda p: _fails_to_compile())
  with pytest.raises(ProgramCompileError, match=r"compiling the forward program of bucket \(8 "):
    first_fails.compile_first()  # start-up fails with the program's name
  engine.ledger.close()
