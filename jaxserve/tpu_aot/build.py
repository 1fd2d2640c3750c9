"""Compiles a server's step programs for a TPU topology and checks its memory (see __init__).

build() runs the whole check: the topology's devices, the abstract server (step_programs.py),
the KV pool sized as on the chip, every program lowered and compiled with libtpu (a thread pool
of `jobs` compiles at once; lowering stays on one thread at a time), then the per-chip memory
against HBM (memory.py). `selection="largest"` compiles, of each kind of program, only those of
the largest bucket (the others' code is then estimated): the quick check for big models.
A program XLA refuses (an SMEM or HBM overflow, a Mosaic layout it cannot lower) is a result
with the compiler's message, and the server does not fit.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tqdm.auto import tqdm

from jaxserve.config import EngineConfig
from jaxserve.models.model_config import ModelConfig
from jaxserve.tpu_aot.chips import TpuChip, topology_devices
from jaxserve.tpu_aot.memory import (
  ProgramMemory,
  ProgramResult,
  ServerMemory,
  misfits,
  server_memory,
  weights_misfit,
)
from jaxserve.tpu_aot.step_programs import (
  ServerShape,
  StepProgram,
  pool_pages,
  server_shape,
  step_programs,
)

SELECTIONS = ("all", "largest")
MAX_ERROR_CHARS = 400


@dataclass(frozen=True)
class BuildRequest:
  config: EngineConfig
  model_config: ModelConfig
  model_name: str
  chip: TpuChip
  selection: str = "all"
  jobs: int = 1
  show_progress: bool = True


@dataclass(frozen=True)
class BuildReport:
  request: BuildRequest
  topology: str
  num_programs: int  # every program warmup compiles
  results: tuple[ProgramResult, ...]  # the compiled ones
  memory: ServerMemory | None  # None when the weights alone do not fit
  problems: tuple[str, ...]  # why it does not fit; empty when it does
  seconds: float

  @property
  def fits(self) -> bool:
    return not self.problems


def build(request: BuildRequest) -> BuildReport:
  if request.selection not in SELECTIONS:
    raise ValueError(f"programs: must be one of {SELECTIONS}, got {request.selection!r}")
  start = time.perf_counter()
  chip, config = request.chip, request.config
  topology = chip.topology(config.tensor_parallel_size)
  shape = server_shape(config, request.model_config, topology_devices(topology))

  def early(problem: str) -> BuildReport:
    return BuildReport(request, topology, 0, (), None, (problem,), time.perf_counter() - start)

  problem = weights_misfit(
    chip,
    shape.weight_bytes_per_chip,
    f"{request.model_name} at tensor_parallel_size {shape.num_chips}",
  )
  if problem:
    return early(problem)
  try:
    num_pages = pool_pages(shape, chip.usable_bytes)  # the TPU client's bytes_limit
  except ValueError as err:
    return early(
      f"KV pool: {err} (per chip, beside {shape.weight_bytes_per_chip} bytes of weights)"
    )
  programs = step_programs(shape, num_pages)
  chosen = programs if request.selection == "all" else largest_of_each_kind(programs)
  results = compile_programs(chosen, request.jobs, request.show_progress)
  memory = server_memory(
    chip,
    shape.weight_bytes_per_chip,
    shape.page_bytes_per_chip,
    num_pages,
    config.cache.page_size,
    shape.max_model_len,
    results,
    [p.id for p in programs],
  )
  return BuildReport(
    request,
    topology,
    len(programs),
    tuple(results),
    memory,
    tuple(misfits(memory, results, topology, lambda fraction: _pages_at(shape, chip, fraction))),
    time.perf_counter() - start,
  )


def _pages_at(shape: ServerShape, chip: TpuChip, fraction: float) -> int:
  """The pool's pages at another cache.memory_fraction (0 where it would hold under 2)."""
  try:
    return pool_pages(shape, chip.usable_bytes, fraction)
  except ValueError:
    return 0


def largest_of_each_kind(programs: list[StepProgram]) -> list[StepProgram]:
  """Of each kind, the programs of its largest bucket (every sampler mode of it)."""

  def size(p: StepProgram) -> tuple[int, int]:
    return (p.id.num_seqs, p.id.num_tokens)

  largest = {}
  for p in programs:
    largest[p.id.kind] = max(largest.get(p.id.kind, (0, 0)), size(p))
  return [p for p in programs if size(p) == largest[p.id.kind]]


def compile_programs(
  programs: list[StepProgram], jobs: int, show_progress: bool
) -> list[ProgramResult]:
  """Lowers (one at a time) and compiles (up to `jobs` at once) every program, in order."""
  lowering = threading.Lock()
  with tqdm(
    total=len(programs), desc="compiling for TPU", unit="program", disable=not show_progress
  ) as progress:

    def run(program: StepProgram) -> ProgramResult:
      result = compile_one(program, lowering)
      progress.set_postfix_str(program.id.name, refresh=False)
      progress.update()
      return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
      return list(pool.map(run, programs))


def compile_one(program: StepProgram, lowering: threading.Lock) -> ProgramResult:
  start = time.perf_counter()
  with lowering:
    lowered = program.lower()
  lowered_at = time.perf_counter()
  try:
    analysis = lowered.compile().memory_analysis()
  except Exception as err:  # XLA's errors (JaxRuntimeError) carry the reason as their text
    message = " ".join(str(err).split())[:MAX_ERROR_CHARS]
    return ProgramResult(
      program.id,
      lowered_at - start,
      time.perf_counter() - lowered_at,
      program.resident_bytes,
      None,
      message,
    )
  return ProgramResult(
    program.id,
    lowered_at - start,
    time.perf_counter() - lowered_at,
    program.resident_bytes,
    ProgramMemory.of(analysis),
    None,
  )
