"""The layers every model family shares, in one place: the attention block and the projection
every GEMM goes through (attention.py), the gated MLP (mlp.py), the routed experts (moe.py), the
norms (norms.py), RoPE (rope.py), and the decoder stack with the choices a family makes in it
(decoder.py: `CausalLM`, `DecoderBlocks`). Nothing here reads which family a config is: the
family modules (models/families/) choose."""
