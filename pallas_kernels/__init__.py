"""Pallas kernels for LLM serving, each contract's variants side by side with its pure-jnp
reference: ragged_paged_attention/ (reference, Pallas GPU (Triton) and TPU (Mosaic), their KV
write kernels), greedy_sample/ (reference, GPU), fixed_tile_matmul/ (reference, GPU),
quantized_matmul/ (reference, GPU), grouped_matmul/ (reference, GPU: a mixture of experts'
grouped matmul), fixed_order.py (the fixed-order row sum the batch-invariant paths share),
triton_params.py (Triton's compiler parameters, for every GPU kernel) and tuning_table.py (the
typed loader of the tuned tile tables the kernels ship as JSON beside their code).

Platform first: a kernel with variants for several platforms keeps each platform's modules in a
subpackage of that name (ragged_paged_attention/gpu/, ragged_paged_attention/tpu/), the shared
reference, validation and test helpers beside them at the kernel's top level; gpu/ and tpu/
never import each other. A kernel of one platform keeps a single gpu.py beside its reference.

Each kernel ships a wrapper that documents every array's shape and raises ValueError on bad
shapes, a pure-jnp reference, an `interpret` flag, and tests (tests/pallas_kernels/) against the
reference. This package is the lowest layer: it imports jax and nothing of jaxserve, so other
JAX projects can use it alone.
"""
