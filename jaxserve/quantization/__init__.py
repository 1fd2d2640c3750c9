"""Quantized weights: the schemes (scheme.py, no jax: config/engine.py reads the names from it), the
quantizers and the quantized matmul the model's projections run (quantize.py, matmul.py, device
side), their pure-numpy references (reference.py) and the compressed-tensors checkpoint format
(compressed_tensors.py, no jax), and which device runs which scheme (capabilities.py, no jax).
Imports nothing of jaxserve; this file imports nothing at all,
so the host side can read the scheme names without jax."""
