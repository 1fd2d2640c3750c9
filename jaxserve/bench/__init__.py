"""Benchmarks, their one home: the `jaxserve bench serve|throughput` commands, the standalone
benchmarks run as `python -m jaxserve.bench.<name>` (bench_offline, bench_kernels, bench_sampler,
bench_tp, bench_startup, bench_bitmask_fill, profile_step, gemm_invariance; perf_tables renders
their JSON for docs/PERFORMANCE.md), and the harness they share (kernel_timing, device_trace,
hlo_ops, latency_stats, goodput, arrivals, datasets, hf_baseline, random_checkpoint,
vocab_tokenizer). Nothing here is imported by the engine or the server."""
