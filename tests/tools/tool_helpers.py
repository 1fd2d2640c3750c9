"""Engine flags shared by the tools tests: one small configuration (one bucket pair, 256 pages of
16 tokens, max_model_len 256) so every tiny-random engine reuses the same compiled step."""

from __future__ import annotations

SMALL_ENGINE_ARGS = [
  "--max-model-len",
  "256",
  "--log-level",
  "WARNING",
  "--set",
  "cache.num_pages=256",
  "--set",
  "cache.page_size=16",
  "--set",
  "scheduler.max_num_seqs=8",
  "--set",
  "scheduler.max_num_batched_tokens=64",
  "--set",
  "scheduler.seq_buckets=[8]",
  "--set",
  "scheduler.token_buckets=[64]",
]
SMALL_NUM_PAGES = 256
