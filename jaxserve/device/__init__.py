"""Device side: bucketed step inputs, the jitted step, sampling, the KV pool and the compile ledger."""
