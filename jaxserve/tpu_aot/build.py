"""Compiles a server's step programs for a TPU topology and checks its memory (see __init__).

build() runs the whole check: the topology's devices, the abstract server (step_programs.py),
the KV pool sized as on the chip, every program lowered and compiled with libtpu (a thread pool
of `jobs` compiles at once; lowering stays on one thread at a time), then the per-chip memory
against HBM (memory.py). `selection="largest"` compiles, of each kind of program, only those of
the largest bucket, in the greedy and the fullest sampler modes (the others' code is then
estimated): the quick check for big models.
`selection="decode"` compiles only the decode step's programs (roofline.py). With a
decode_context, the decode step's forward and greedy sampler are compiled whatever the selection,
for the roofline. A program XLA refuses (an SMEM or HBM overflow, a Mosaic layout it cannot
lower) is a result with the compiler's message, and the server does not fit. With a result
cache (result_cache.py) a program whose lowered text, target and toolchain compiled before takes
that compile's result instead of compiling again (a refusal is compiled again every time).

The topology is a one-host slice of `slice_chips` chips (default: tensor_parallel_size), and the
server's mesh its first tensor_parallel_size chips: one data-parallel replica of a slice that
holds several (layouts.py).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import jax
from tqdm.auto import tqdm

from jaxserve.config import EngineConfig
from jaxserve.models.model_config import ModelConfig
from jaxserve.tpu_aot.chips import TpuChip, topology_devices
from jaxserve.tpu_aot.cost import ProgramCost
from jaxserve.tpu_aot.memory import (
  ProgramMemory,
  ProgramResult,
  ServerMemory,
  misfits,
  server_memory,
  weights_misfit,
)
from jaxserve.tpu_aot.result_cache import CompileOutcome, CompileResultCache
from jaxserve.tpu_aot.roofline import decode_batch
from jaxserve.tpu_aot.step_programs import (
  ProgramId,
  ServerShape,
  StepProgram,
  decode_program_ids,
  pool_pages,
  server_shape,
  step_programs,
)

SELECTIONS = ("all", "largest", "decode")
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
  slice_chips: int = 0  # the topology's chips (0: tensor_parallel_size)
  decode_context: int = 0  # > 0: also compile the decode step of sequences this long
  result_cache: Path | None = None  # a directory of compile results (result_cache.py)


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
  slice_chips = request.slice_chips or config.tensor_parallel_size
  if config.tensor_parallel_size > slice_chips:
    raise ValueError(
      f"tensor_parallel_size: {config.tensor_parallel_size} exceeds the slice's {slice_chips} chips"
    )
  topology = chip.topology(slice_chips)
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
  chosen = choose(programs, request.selection, _decode_ids(config, num_pages, request))
  cache = CompileResultCache(request.result_cache) if request.result_cache else None
  results = compile_programs(chosen, request.jobs, request.show_progress, cache, topology)
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


def _decode_ids(config: EngineConfig, num_pages: int, request: BuildRequest) -> set[ProgramId]:
  context = request.decode_context
  if request.selection == "decode" and not context:
    raise ValueError("programs: decode needs a decode context (--decode-context)")
  bucket = decode_batch(config, num_pages, context)[1] if context else None
  return set(decode_program_ids(bucket)) if bucket else set()


def choose(
  programs: list[StepProgram], selection: str, decode: set[ProgramId]
) -> list[StepProgram]:
  """The selection's programs plus those of `decode`, in warmup's order."""
  if selection == "all":
    return programs
  picked = set(largest_of_each_kind(programs)) if selection == "largest" else set()
  return [p for p in programs if p in picked or p.id in decode]


def largest_of_each_kind(programs: list[StepProgram]) -> list[StepProgram]:
  """Of each kind, the programs of its largest bucket, and of their sampler modes the two ends:
  greedy (the fewest parts) and the fullest (random with penalties and top logprobs), whose code
  holds every other mode's parts (ProgramId.parts). The modes between compile in
  `all`; `largest` counts their code at the largest compiled program of their kind."""

  def size(p: StepProgram) -> tuple[int, int]:
    return (p.id.num_seqs, p.id.num_tokens)

  largest: dict[str, tuple[int, int]] = {}
  for p in programs:
    largest[p.id.kind] = max(largest.get(p.id.kind, (0, 0)), size(p))
  chosen = [p for p in programs if size(p) == largest[p.id.kind]]
  ends: dict[str, set[int]] = {}
  for kind in largest:
    parts = [p.id.parts for p in chosen if p.id.kind == kind]
    ends[kind] = {min(parts), max(parts)}
  return [p for p in chosen if p.id.mode is None or p.id.parts in ends[p.id.kind]]


def compile_programs(
  programs: list[StepProgram],
  jobs: int,
  show_progress: bool,
  cache: CompileResultCache | None = None,
  target: str = "",
) -> list[ProgramResult]:
  """Lowers (one at a time) and compiles (up to `jobs` at once) every program, in order; with a
  cache, a program compiled before for `target` takes that result."""
  lowering = threading.Lock()
  with tqdm(
    total=len(programs), desc="compiling for TPU", unit="program", disable=not show_progress
  ) as progress:

    def run(program: StepProgram) -> ProgramResult:
      result = compile_one(program, lowering, cache, target)
      progress.set_postfix_str(program.id.name, refresh=False)
      progress.update()
      return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
      return list(pool.map(run, programs))


def compile_one(
  program: StepProgram,
  lowering: threading.Lock,
  cache: CompileResultCache | None = None,
  target: str = "",
) -> ProgramResult:
  start = time.perf_counter()
  with lowering:
    lowered = program.lower()
  lowered_at = time.perf_counter()
  key = cache.key(lowered.as_text(), target) if cache else ""
  outcome = cache.get(key) if cache else None
  cached = outcome is not None
  if outcome is None:
    outcome = _compile(lowered)
    if cache and outcome.error is None:  # a refusal is not kept: it may be the host's
      cache.put(key, outcome)
  return ProgramResult(
    program.id,
    lowered_at - start,
    time.perf_counter() - lowered_at,
    program.resident_bytes,
    outcome.memory,
    outcome.error,
    outcome.cost,
    cached,
  )


def _compile(lowered: jax.stages.Lowered) -> CompileOutcome:
  try:
    compiled = lowered.compile()
    analysis, cost = compiled.memory_analysis(), ProgramCost.of(compiled.cost_analysis())
  except Exception as err:  # XLA's errors (JaxRuntimeError) carry the reason as their text
    return CompileOutcome(None, None, " ".join(str(err).split())[:MAX_ERROR_CHARS])
  return CompileOutcome(ProgramMemory.of(analysis), cost, None)
