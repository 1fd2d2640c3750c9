"""x @ (8-bit weight * per-channel scale).T for few rows (decode steps) on GPUs, dequantizing in
registers: the 8-bit weights are the only large read."""
