"""Kernels, each contract's variants side by side: ragged_paged_attention/ (the pure-jnp
reference, the blocked XLA version, Pallas for GPU and TPU) and greedy_sample/ (reference, GPU).
Each kernel ships a validated wrapper, an interpret path and tests against its reference."""
