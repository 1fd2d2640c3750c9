"""Greedy sampling reduction: each row's argmax (with banned ids masked) and log-normalizer."""
