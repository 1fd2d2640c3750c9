"""A GEMM whose per-row result does not depend on the number of rows (batch_invariant)."""
