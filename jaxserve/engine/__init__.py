"""Host side: requests, page allocation, scheduling and the engine loop (no jax in the first three)."""
