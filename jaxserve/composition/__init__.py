"""The composition root: assembly.py builds an engine (device, model, KV pool, engine loop) from
an EngineConfig, pool_sizing.py sizes its KV pool. Only the entry points (entrypoints/, the
CLI) and the engine core process (core/) import it; the device side and server/ never do."""
