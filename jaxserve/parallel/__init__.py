"""Scale-out: the device mesh, the partition rules, placement (one device or a mesh), per-shard
attention and GEMMs, and multi-host step transport."""
