"""rows sorted by group [M, K] @ each group's weights [G, K, N] (a mixture of experts' FFN) on
GPUs, with the gated SwiGLU of two such products fused: tiles.py maps the groups' runs of rows to
row tiles, gpu.py is the Pallas (Triton) kernel, fp8.py its W8A8 fp8 sibling (e4m3 weights
[G, N, K] with per-channel or 128 x 128 block scales, the rows quantized per token), reference.py
their pure-jnp references; routing.py sorts a MoE step's assignments by expert (a counting-sort
kernel) and routed.py runs the two products on them, rows gathered from the tokens and outputs
scattered to the assignments."""
