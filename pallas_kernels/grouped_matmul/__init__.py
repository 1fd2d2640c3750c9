"""rows sorted by group [M, K] @ each group's weights [G, K, N] (a mixture of experts' FFN) on
GPUs, with the gated SwiGLU of two such products fused: tiles.py maps the groups' runs of rows to
row tiles, gpu.py is the Pallas (Triton) kernel, reference.py its pure-jnp reference; routing.py
sorts a MoE step's assignments by expert (a counting-sort kernel) and routed.py runs the two
products on them, rows gathered from the tokens and outputs scattered to the assignments."""
