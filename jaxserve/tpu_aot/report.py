"""The compile-tpu report: a per-program table and the per-chip memory, as text and as JSON."""

from __future__ import annotations

import dataclasses

from jaxserve.tpu_aot.build import BuildReport, BuildRequest
from jaxserve.tpu_aot.memory import ProgramResult, ServerMemory, gib

MIB = 2**20


def _mib(num_bytes: int) -> str:
  return f"{num_bytes / MIB:.1f}"


def program_rows(results: tuple[ProgramResult, ...]) -> list[str]:
  header = (
    f"{'program':<34} {'lower s':>8} {'compile s':>9} {'args MiB':>9} {'out MiB':>8} "
    f"{'temp MiB':>9} {'code MiB':>9}"
  )
  rows = [header]
  for r in results:
    m = r.memory
    cells = (
      [_mib(m.arguments), _mib(m.outputs), _mib(m.temporaries), _mib(m.code)]
      if m
      else ["FAILED", "", "", ""]
    )
    rows.append(
      f"{r.id.name:<34} {r.lower_seconds:>8.1f} "
      f"{'cached' if r.cached else f'{r.compile_seconds:.1f}':>9} "
      f"{cells[0]:>9} {cells[1]:>8} {cells[2]:>9} {cells[3]:>9}"
    )
  return rows


def memory_rows(memory: ServerMemory, num_programs: int, num_compiled: int) -> list[str]:
  code_note = (
    f"measured on {num_compiled}, the other {num_programs - num_compiled} counted at "
    "the largest compiled program of their kind"
    if memory.code_estimated
    else f"all {num_programs} programs"
  )
  return [
    f"per chip ({memory.chip.name}: HBM {gib(memory.chip.hbm_bytes)}, of which XLA may use "
    f"{gib(memory.chip.usable_bytes)}):",
    f"  weights                {gib(memory.weights):>11}",
    f"  KV pool                {gib(memory.pool):>11}  ({memory.num_pages} pages of "
    f"{memory.page_size} tokens, {memory.page_bytes / MIB:.2f} MiB per page per chip)",
    f"  largest step transient {gib(memory.largest_transient):>11}  "
    f"({memory.largest_transient_program})",
    f"  program code           {gib(memory.code):>11}  ({code_note})",
    f"  total                  {gib(memory.total):>11}  (headroom {gib(memory.headroom)})",
    f"capacity: {memory.num_pages - 1} usable pages = {memory.token_capacity} tokens = "
    f"{memory.full_length_sequences} sequences of max_model_len {memory.max_model_len}",
  ]


def weights_description(request: BuildRequest) -> str:
  """The weights' and KV pages' types, e.g. "bfloat16, int8 projections, int8 KV pages"."""
  model, cache = request.model_config, request.config.cache
  parts = [model.dtype]
  if model.quantization != "none":
    parts.append(f"{model.quantization} projections")
  parts.append(f"{cache.storage_dtype(model.dtype)} KV pages")
  return ", ".join(parts)


def format_report(report: BuildReport) -> str:
  request = report.request
  lines = [
    f"compile-tpu: {request.model_name} ({weights_description(request)}) on "
    f"{report.topology}, tensor_parallel_size {request.config.tensor_parallel_size}, "
    f"{len(report.results)} of {report.num_programs} programs compiled "
    f"({request.selection}) in {report.seconds:.1f} s"
  ]
  if report.results:
    lines += program_rows(report.results)
  if report.memory is not None:
    lines += memory_rows(report.memory, report.num_programs, len(report.results))
  lines.append("result: fits" if report.fits else "result: DOES NOT FIT")
  lines += [f"  {problem}" for problem in report.problems]
  return "\n".join(lines)


def report_json(report: BuildReport) -> dict:
  """The report as plain data (bytes per chip, seconds)."""
  memory = report.memory
  return {
    "model": report.request.model_name,
    "topology": report.topology,
    "chip": report.request.chip.name,
    "hbm_bytes": report.request.chip.hbm_bytes,
    "usable_bytes": report.request.chip.usable_bytes,
    "tensor_parallel_size": report.request.config.tensor_parallel_size,
    "quantization": report.request.model_config.quantization,
    "kv_cache_dtype": report.request.config.cache.kv_cache_dtype,
    "selection": report.request.selection,
    "num_programs": report.num_programs,
    "seconds": report.seconds,
    "fits": report.fits,
    "problems": list(report.problems),
    "programs": [
      {
        "name": r.id.name,
        "lower_seconds": r.lower_seconds,
        "compile_seconds": r.compile_seconds,
        "cached": r.cached,
        "error": r.error,
        "memory": dataclasses.asdict(r.memory) if r.memory else None,
      }
      for r in report.results
    ],
    "memory": None
    if memory is None
    else {
      "weights": memory.weights,
      "kv_pool": memory.pool,
      "num_pages": memory.num_pages,
      "page_bytes": memory.page_bytes,
      "largest_transient": memory.largest_transient,
      "largest_transient_program": memory.largest_transient_program,
      "code": memory.code,
      "code_estimated": memory.code_estimated,
      "total": memory.total,
      "headroom": memory.headroom,
      "token_capacity": memory.token_capacity,
      "full_length_sequences": memory.full_length_sequences,
      "max_model_len": memory.max_model_len,
    },
  }
