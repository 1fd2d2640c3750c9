"""One-off investigations on a device: the measurements behind design decisions and
docs/PERFORMANCE.md, kept runnable. Not part of the installed package (pyproject's package find
includes jaxserve* and pallas_kernels* only): run them from the repository root,

    python -m investigations.<name> --help

Most run as steps of scripts/gpu_session.sh on a GPU machine. They may import jaxserve and
pallas_kernels; nothing in either imports them (tests/architecture/). The benchmarks a user
runs on their own deployment are `jaxserve bench ...` (jaxserve/bench/, docs/BENCHMARKS.md).

  bench_kernels        the ragged paged-attention kernel against the HBM copy ceiling, the XLA
                       reference and JAX's bundled Pallas paged_attention (kernel_timing: its
                       harnesses); perf_tables renders its JSON and offline runs' as Markdown
  bench_sampler        the greedy sampling reduction: XLA against the Pallas kernel's tiles
  bench_sampler_modes  what each static sampler mode costs per call
  bench_bitmask_fill   host time to fill structured-output bitmasks for a batch
  bench_tp             tensor-parallel parity, step time and all-reduce time on several GPUs
  tpu_8bit_dots        what fp8 / int8 GEMMs cost on each TPU chip, from libtpu's cost model
  gemm_invariance      which GEMM formulations give bitwise-equal rows and column / row splits
  profile_step         where a step's device time goes (device_trace: profiler traces;
                       hlo_ops: the XLA instruction behind a kernel)
"""
