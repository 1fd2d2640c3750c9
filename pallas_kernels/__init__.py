"""Pallas kernels for LLM serving, each contract's variants side by side with its pure-jnp
reference: ragged_paged_attention/ (reference, Pallas GPU (Triton) and TPU (Mosaic), their KV
write kernels), greedy_sample/ (reference, GPU), fixed_tile_matmul/ (reference, GPU),
quantized_matmul/ (reference, GPU), grouped_matmul/ (reference, GPU: a mixture of experts'
grouped matmul), and fixed_order.py (the fixed-order row sum the batch-invariant paths share).

Each kernel ships a wrapper that documents every array's shape and raises ValueError on bad
shapes, a pure-jnp reference, an `interpret` flag, and tests (tests/pallas_kernels/) against the
reference. This package is the lowest layer: it imports jax and nothing of jaxserve, so other
JAX projects can use it alone.
"""
