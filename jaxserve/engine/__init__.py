"""Host side: admission rules, requests, page allocation, scheduling, the batch builder (no jax in
any of these) and the engine loop. Talks to the device side through messages/ only."""
