"""Benchmarks (`jaxserve bench serve|throughput`), the offline eval harness (`jaxserve eval`) and
the KV-cache planner (`jaxserve kv-plan`). Nothing here is imported by the engine or the server."""
