"""Device side: the ScheduledBatch padded into bucketed step inputs, the step programs
(build_step_programs), the one ModelRunner, warmup and lowering, sampling, the KV pool and the
compile ledger. Imports nothing from the host side (engine/, server/)."""
