"""What Triton makes of a Pallas GPU kernel, without a GPU: the kernel (the ragged paged
attention at a decode or prefill shape, or the quantized decode matmul) is lowered for CUDA (an
H100 as the abstract target), the Triton module Pallas hands to XLA is captured, and, where a
`triton` package is installed (in any Python: --triton-python; it is no dependency of jaxserve),
compiled for sm_90 with the kernel's num_warps / num_stages. Per module it prints the shared
memory a program takes, its registers per thread and spilled bytes (ptxas -v), the programs an
H100 SM holds by shared memory and by registers, and the TritonGPU ops that tell how tiles move:
async copies (global -> shared, pipelined), shared -> register loads, and register -> shared
stores (`local_alloc` of a computed tensor: a tile that round-trips through shared memory
before a dot).

XLA compiles the same module with its own copy of Triton, whose passes can differ from the
installed package's; the numbers say how a version of Triton lays the kernel out, not how fast
it runs. Capturing the module patches a private JAX function (pallas/triton/lowering.py's
lower_jaxpr_to_triton_module), which a JAX release may rename.

    python -m investigations.triton_static --pages bfloat16 float8_e4m3fn \
      --triton-python /path/to/venv-with-triton/bin/python
    python -m investigations.triton_static --kernel quantized_matmul --programs 264 \
      --triton-python /path/to/venv-with-triton/bin/python

The kernels' calls are built in one place, here (`AttentionShape`, `attention_call`,
`write_kv_call`; `lowered_modules` lowers and captures them): tests/pallas_kernels/
test_gpu_addressing.py reads the page offsets' integer types from the same calls.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  import jax
  from jax.typing import DTypeLike

# jax is imported where a module is captured: --compile-ttir runs in a Python with only triton.
SM_SHARED_BYTES = 228 * 1024  # an H100 SM's shared memory
SM_REGISTERS = 64 * 1024  # 32-bit registers per H100 SM
OPS = {
  "async_copies": r"ttg\.async_copy_global_to_local",
  "shared_loads": r"ttg\.local_load",
  "register_to_shared": r"ttg\.local_alloc %",
  "dots": r"tt\.dot |ttng\.warp_group_dot ",
}


@contextlib.contextmanager
def captured_triton_modules() -> Iterator[list[str]]:
  """Collects the text of each Triton module Pallas lowers inside the block."""
  from jax._src.pallas.triton import lowering

  modules: list[str] = []
  original = lowering.lower_jaxpr_to_triton_module

  def capture(*args, **kwargs):
    result = original(*args, **kwargs)
    modules.append(result.module.operation.get_asm(enable_debug_info=False))
    return result

  lowering.lower_jaxpr_to_triton_module = capture
  try:
    yield modules
  finally:
    lowering.lower_jaxpr_to_triton_module = original


def _h100_target():
  import jax

  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=132, platform="gpu")
  return jax.sharding.use_abstract_mesh(
    jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  )


@dataclasses.dataclass(frozen=True)
class AttentionShape:
  """A step as the GPU attention kernel's call sees it: the model's heads (Llama-3.1-8B's by
  default: 32 q, 8 kv, head_dim 128), num_seqs sequences of query_len tokens each (1: a decode
  step, more: a prefill chunk) over pages_per_seq pages of page_size tokens, in a page array of
  num_pages pages (None: the sequences' own, num_seqs * pages_per_seq), stacked over num_slots
  KV slots (layers) as the engine's pool is."""

  num_seqs: int
  pages_per_seq: int
  query_len: int = 1
  q_heads: int = 32
  kv_heads: int = 8
  head_dim: int = 128
  page_size: int = 16
  num_pages: int | None = None
  num_slots: int = 1

  @property
  def num_tokens(self) -> int:
    return self.num_seqs * self.query_len

  def pages(self, dtype: DTypeLike) -> jax.ShapeDtypeStruct:
    """The stacked pool [num_slots, kv_heads, num_pages, page_size, head_dim]."""
    import jax

    num_pages = self.num_pages or self.num_seqs * self.pages_per_seq
    shape = (self.num_slots, self.kv_heads, num_pages, self.page_size, self.head_dim)
    return jax.ShapeDtypeStruct(shape, dtype)


@dataclasses.dataclass(frozen=True)
class KernelCall:
  """A kernel's jitted body with its keyword arguments bound, and abstract positional arguments
  (jax.ShapeDtypeStructs: no device, no memory) to lower it with."""

  fn: Callable[..., object]
  args: tuple[jax.ShapeDtypeStruct, ...]
  annotation: str = ""  # appended to the captured module (the launch parameters)


def attention_call(shape: AttentionShape, pages_dtype: DTypeLike, **tile_keywords) -> KernelCall:
  """ragged_paged_attention's call at `shape` on pages of pages_dtype, with the tiling an H100
  gets (gpu/tiling.py: choose_tiling; tile_keywords override it: block_kv, num_stages, ...)."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels.ragged_paged_attention.gpu import attention as gpu

  spec = jax.ShapeDtypeStruct
  pages = shape.pages(pages_dtype)
  args = (
    spec((shape.num_tokens, shape.q_heads, shape.head_dim), jnp.bfloat16),  # q [T, H, D]
    pages,
    pages,
    spec((1,), jnp.int32),  # kv_slot
    spec((shape.num_seqs, shape.pages_per_seq), jnp.int32),  # block_tables
    spec((shape.num_seqs,), jnp.int32),  # seq_lens
    spec((shape.num_seqs + 1,), jnp.int32),  # query_start_loc
    spec((1,), jnp.int32),  # num_seqs
  )
  tiling = gpu.choose_tiling(
    shape.num_tokens,
    shape.num_seqs,
    shape.q_heads,
    shape.kv_heads,
    shape.head_dim,
    max_kv_len=shape.pages_per_seq * shape.page_size,
    page_itemsize=jnp.dtype(pages_dtype).itemsize,
    **tile_keywords,
  )
  # The jitted body, not the wrapper: the wrapper asks the local device for its tiling (a CPU
  # here has no Hopper shared memory), and the tiling is the H100's above.
  fn = functools.partial(
    gpu._ragged_paged_attention,
    tiling=tiling,
    sm_scale=shape.head_dim**-0.5,
    v_scale=1.0,
    sliding_window=None,
    soft_cap=None,
    interpret=False,
  )
  return KernelCall(fn, args, f"num_warps={tiling.num_warps} num_stages={tiling.num_stages}")


def write_kv_call(
  shape: AttentionShape, pages_dtype: DTypeLike, *, block_tokens: int = 16, num_warps: int = 4
) -> KernelCall:
  """The GPU K/V write's call at `shape`: the step's new K and V rows into pages of pages_dtype
  at a slot mapping."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels.ragged_paged_attention.gpu import write as gpu_write

  spec = jax.ShapeDtypeStruct
  pages = shape.pages(pages_dtype)
  rows = spec((shape.num_tokens, shape.kv_heads, shape.head_dim), pages_dtype)
  fn = functools.partial(
    gpu_write._write_kv, block_tokens=block_tokens, num_warps=num_warps, interpret=False
  )
  slots = spec((shape.num_tokens,), jnp.int32)
  return KernelCall(fn, (pages, pages, spec((1,), jnp.int32), rows, rows, slots))


def lowered_modules(*calls: KernelCall) -> list[str]:
  """The Triton module(s) of each call lowered for CUDA on an abstract H100, in order, each
  followed by its call's annotation as a comment line."""
  import jax

  found = []
  for call in calls:
    with captured_triton_modules() as modules, _h100_target():
      jax.jit(call.fn).trace(*call.args).lower(lowering_platforms=("cuda",))
    found += [m + f"\n// {call.annotation}" if call.annotation else m for m in modules]
  return found


def attention_modules(
  pages_dtype: DTypeLike,
  *,
  num_seqs: int,
  context: int,
  query_len: int = 1,
  page_size: int = 16,
  **tile_keywords,
) -> list[str]:
  """The Triton module(s) of a step's ragged paged attention (Llama-3.1-8B's heads) for
  num_seqs sequences of `context` tokens, query_len of them new (attention_call)."""
  shape = AttentionShape(
    num_seqs, pages_per_seq=-(-context // page_size), query_len=query_len, page_size=page_size
  )
  return lowered_modules(attention_call(shape, pages_dtype, **tile_keywords))


def quantized_matmul_modules(
  n: int, k: int, *, rows: int = 8, quantize_x: bool = True, **tile_fields
) -> list[str]:
  """The Triton module of pallas_kernels/quantized_matmul for x [rows, K] bfloat16 times an fp8
  weight [N, K], with default_tiling's tiling (tile_fields replace its fields: programs, ...)."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels.quantized_matmul import gpu

  tiling = dataclasses.replace(gpu.default_tiling(n, k, quantize_x=quantize_x), **tile_fields)
  fn = functools.partial(gpu.quantized_matmul, tiling=tiling, quantize_x=quantize_x)
  spec = jax.ShapeDtypeStruct
  args = (
    spec((rows, k), jnp.bfloat16),
    spec((n, k), jnp.float8_e4m3fn),
    spec((n,), jnp.float32),
  )
  annotation = f"num_warps={tiling.num_warps} num_stages={tiling.num_stages}"
  return lowered_modules(KernelCall(fn, args, annotation))


def count_ops(ttgir: str) -> dict[str, int]:
  return {name: len(re.findall(pattern, ttgir)) for name, pattern in OPS.items()}


def compile_ttir(path: str) -> dict:
  """Runs in the Python that has `triton`: compiles one captured module for sm_90."""
  import triton
  from triton.backends.compiler import GPUTarget

  text = open(path).read()
  warps, stages = (int(v) for v in re.search(r"num_warps=(\d+) num_stages=(\d+)", text).groups())
  kernel = triton.compile(
    path, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}
  )
  ptx_path = path + ".ptx"
  open(ptx_path, "w").write(kernel.asm["ptx"])
  bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
  ptxas = next(
    os.path.join(bin_dir, name)
    for name in ("ptxas-blackwell", "ptxas")
    if os.path.exists(os.path.join(bin_dir, name))
  )
  report = subprocess.run(
    [ptxas, "-arch=sm_90a", "-v", ptx_path, "-o", os.devnull], capture_output=True, text=True
  ).stderr
  registers = re.search(r"Used (\d+) registers", report)
  spills = re.search(r"(\d+) bytes spill stores", report)
  mma = re.search(r"nvidia_mma<\{versionMajor = (\d)", kernel.asm["ttgir"])
  return {
    "triton": triton.__version__,
    "num_warps": warps,
    "num_stages": stages,
    "shared_bytes": kernel.metadata.shared,
    "registers": int(registers.group(1)) if registers else None,
    "spill_bytes": int(spills.group(1)) if spills else None,
    "mma_version": int(mma.group(1)) if mma else None,
    **count_ops(kernel.asm["ttgir"]),
  }


def programs_per_sm(row: dict) -> dict[str, int]:
  threads = 32 * row["num_warps"]
  by_regs = SM_REGISTERS // (threads * row["registers"]) if row["registers"] else None
  return {"by_shared": SM_SHARED_BYTES // max(row["shared_bytes"], 1), "by_registers": by_regs}


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--kernel", choices=("attention", "quantized_matmul"), default="attention")
  parser.add_argument("--pages", nargs="+", default=["bfloat16", "float8_e4m3fn", "int8"])
  parser.add_argument(
    "--shapes",
    nargs="+",
    default=["6144x4096", "4096x4096", "28672x4096", "4096x14336"],
    help="quantized_matmul: weights NxK (default: Llama-3.1-8B's merged projections)",
  )
  parser.add_argument("--programs", type=int, help="quantized_matmul: Tiling.programs")
  parser.add_argument(
    "--weight-only", action="store_true", help="quantized_matmul: no quantize_x (W8A16)"
  )
  parser.add_argument("--num-seqs", type=int, default=512)
  parser.add_argument("--context", type=int, default=1500)
  parser.add_argument("--query-len", type=int, default=1, help="tokens a sequence (1: decode)")
  parser.add_argument("--block-kv", type=int, help="KV tokens per tile (default: the H100's)")
  parser.add_argument("--num-stages", type=int, help="pipeline stages (default: the H100's)")
  parser.add_argument("--num-warps", type=int, help="warps a program (default: the H100's)")
  parser.add_argument("--triton-python", help="a Python with `triton` installed (compiles)")
  parser.add_argument("--out-dir", help="keep the captured modules here (default: a temp dir)")
  parser.add_argument("--compile-ttir", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.compile_ttir:
    print(json.dumps(compile_ttir(args.compile_ttir)))
    return
  out_dir = args.out_dir or tempfile.mkdtemp(prefix="triton_static_")
  os.makedirs(out_dir, exist_ok=True)
  print(f"{'module':>14} {'shared B':>9} {'regs':>5} {'spill B':>7} {'SM by smem/regs':>16} ops")
  for name, module in _modules(args):
    path = os.path.join(out_dir, f"{args.kernel}_{name}.ttir")
    open(path, "w").write(module)
    if not args.triton_python:
      print(f"{name:>14} (captured {path}; --triton-python compiles it)")
      continue
    done = subprocess.run(
      [args.triton_python, os.path.abspath(__file__), "--compile-ttir", path],
      capture_output=True,
      text=True,
      check=True,
    )
    row = json.loads(done.stdout.strip().splitlines()[-1])
    fit = programs_per_sm(row)
    ops = {k: row[k] for k in OPS}
    print(
      f"{name:>14} {row['shared_bytes']:>9} {row['registers']:>5} {row['spill_bytes']:>7} "
      f"{fit['by_shared']:>8}/{fit['by_registers']:<7} mma v{row['mma_version']} {ops}"
    )
  print(f"modules in {out_dir}", file=sys.stderr)


def _modules(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
  """(name, module text) of each module the arguments ask for."""
  if args.kernel == "quantized_matmul":
    fields = {"num_stages": args.num_stages, "num_warps": args.num_warps, "programs": args.programs}
    for shape in args.shapes:
      n, k = (int(v) for v in shape.split("x"))
      (module,) = quantized_matmul_modules(
        n, k, quantize_x=not args.weight_only, **{f: v for f, v in fields.items() if v}
      )
      yield shape, module
    return
  tiles = {"block_kv": args.block_kv, "num_stages": args.num_stages, "num_warps": args.num_warps}
  for dtype in args.pages:
    (module,) = attention_modules(
      dtype,
      num_seqs=args.num_seqs,
      context=args.context,
      query_len=args.query_len,
      **{t: v for t, v in tiles.items() if v},
    )
    yield dtype, module


if __name__ == "__main__":
  main()
