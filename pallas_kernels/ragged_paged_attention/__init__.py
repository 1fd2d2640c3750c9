"""Ragged paged attention (mixed prefill + decode batches over a paged KV cache), platform first:
gpu/ (Pallas Triton: attention.py the wrapper, kernel.py its body, write.py the KV write,
tiling.py and tiling_table.json its tiles, program_map.py, addressing.py), tpu/ (Pallas Mosaic:
attention.py, kernel.py, write.py), and shared by both: reference.py (the pure-jnp contract),
validate.py (the wrappers' shape checks), kv_quant.py (the 8-bit page format) and testing.py
(the cases the variants' tests share)."""
