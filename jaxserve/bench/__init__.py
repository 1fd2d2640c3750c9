"""The benchmarks a user runs on their own deployment: the `jaxserve bench` commands (cli.py, their
flags in flags.py; docs/BENCHMARKS.md) serve (bench_serve, its client processes in
serve_client, client_processes and client_usage), throughput (bench_throughput),
offline (bench_offline), structured (bench_structured), startup (bench_startup), server-startup
(bench_server_startup) and batch-invariance (batch_invariance, with its component checks in
invariance_components and invariance_attention); serve_vs_offline, run as
`python -m jaxserve.bench.serve_vs_offline`; and the harness they share (arrivals, datasets,
latency_stats, goodput, timing, server_process, process_cpu, hf_baseline, random_checkpoint,
vocab_tokenizer, structured_workload). One-off device investigations live outside the package,
in investigations/ at the repository root. Nothing here is imported by the engine or the server.
"""
