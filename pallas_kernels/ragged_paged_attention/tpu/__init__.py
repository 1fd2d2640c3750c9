"""The TPU (Pallas Mosaic) ragged paged attention: attention.ragged_paged_attention and
write.write_kv. Imports nothing of ../gpu/."""
