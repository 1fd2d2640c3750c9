"""Scale-out: the device mesh, the partition rules, per-shard attention and multi-host serving."""
