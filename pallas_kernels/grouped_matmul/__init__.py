"""rows sorted by group [M, K] @ each group's weights [G, K, N] (a mixture of experts' FFN) on
GPUs, with the gated SwiGLU of two such products fused: tiles.py maps the groups' runs of rows to
row tiles, gpu.py is the Pallas (Triton) kernel, reference.py its pure-jnp reference."""
