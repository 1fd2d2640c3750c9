"""Tools around the engine: the offline eval harness (`jaxserve eval`), the KV-cache planner
(`jaxserve kv-plan`), the tiny-random Hugging Face export and plots. Benchmarks live in
jaxserve/bench/. Nothing here is imported by the engine or the server."""
