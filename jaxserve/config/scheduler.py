"""Continuous batching's settings (`scheduler:`): SchedulerConfig, validated on construction
(ValueError naming the field); no jax. engine/scheduler.py and its modules read it."""

from __future__ import annotations

from dataclasses import dataclass

from jaxserve.config.require import require as _require
from jaxserve.config.require import require_bool

SCHEDULING_POLICIES = ("fcfs", "priority")  # engine/request_queue.py orders by them


@dataclass(frozen=True)
class SchedulerConfig:
  """Continuous batching limits. Bucket lists default to powers of two up to the limits.
  async_scheduling: the engine core schedules and dispatches step N+1 while step N runs
  (EngineCore.step, engine/engine_core.py).
  num_scheduler_steps > 1 runs decode-only steps as bursts of that many decode steps in one
  dispatch when every running request allows it (engine/scheduler.py, device/step_fns.py).
  bucket_padding: the default bucket ladders grow by 1 / (1 - bucket_padding) a rung (0.5:
  powers of two), so padding fills at most that share of a bucket (messages/buckets.py).
  prefill_first: a step that can prefill (admit a waiting request or continue a chunked prompt)
  runs prefills only, and decoding requests wait for a step without prefill work (throughput
  over inter-token latency, as vLLM's non-chunked scheduler; engine/scheduler.py).
  mixed_step_prefill_tokens: P; a step in which D running requests decode carries at most
  max(P, max_num_batched_tokens x (max_num_seqs - D) / max_num_seqs) prompt tokens (running
  prompts' chunks and admissions; None: whatever the budget leaves), so a full batch's steps
  that also prefill run a bounded time longer than decode-only ones and streams' gaps between
  tokens stay even while prompts arrive; prompts then take more steps (engine/scheduler.py).
  latency_batched_tokens: L; with L < max_num_batched_tokens (B) the step's token budget follows
  the load (engine/step_budget.py): a step carries at most L tokens, or a larger rung of the token
  ladder (up to B) when few requests decode and the prompts at hand fill that rung; the token
  ladder is dense up to L and its rungs above L pair with the largest sequence rung only
  (messages/buckets.py). None: every step may carry B tokens (a fixed budget, vLLM's).
  pool_seq_rungs: once the KV pool is sized, add sequence rungs where it bounds the batch (the
  max_model_len sequences it holds, twice and four times that; BucketSet.with_pool_rungs), so a
  sparse ladder does not pad a KV-bound batch to its largest rung.
  policy: the waiting queue's order (engine/request_queue.py): "fcfs" by arrival, "priority" by
  the request's priority (lower first), then arrival; the least urgent running request is
  preempted first."""

  max_num_seqs: int = 64
  max_num_batched_tokens: int = 512
  enable_chunked_prefill: bool = True
  enable_prefix_caching: bool = True
  seq_buckets: tuple[int, ...] | None = None
  token_buckets: tuple[int, ...] | None = None
  async_scheduling: bool = True
  num_scheduler_steps: int = 1
  prefill_first: bool = False
  bucket_padding: float = 0.5
  pool_seq_rungs: bool = False
  mixed_step_prefill_tokens: int | None = None
  latency_batched_tokens: int | None = None
  policy: str = "fcfs"

  def __post_init__(self) -> None:
    _require(
      isinstance(self.bucket_padding, (int, float)) and 0 < self.bucket_padding < 1,
      "scheduler.bucket_padding",
      f"must be in (0, 1), got {self.bucket_padding!r}",
    )
    _require(
      self.policy in SCHEDULING_POLICIES,
      "scheduler.policy",
      f"must be one of {SCHEDULING_POLICIES}, got {self.policy!r}",
    )
    require_bool(self.prefill_first, "scheduler.prefill_first")
    require_bool(self.pool_seq_rungs, "scheduler.pool_seq_rungs")
    require_bool(self.async_scheduling, "scheduler.async_scheduling")
    _require(
      isinstance(self.num_scheduler_steps, int) and 1 <= self.num_scheduler_steps <= 64,
      "scheduler.num_scheduler_steps",
      f"must be an integer in [1, 64], got {self.num_scheduler_steps!r}",
    )
    _require(
      isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1,
      "scheduler.max_num_seqs",
      f"must be an integer >= 1, got {self.max_num_seqs!r}",
    )
    _require(
      isinstance(self.max_num_batched_tokens, int)
      and self.max_num_batched_tokens >= self.max_num_seqs,
      "scheduler.max_num_batched_tokens",
      f"must be an integer >= max_num_seqs ({self.max_num_seqs}), "
      f"got {self.max_num_batched_tokens!r}",
    )
    _require(  # above max_num_batched_tokens it changes nothing
      self.mixed_step_prefill_tokens is None
      or (isinstance(self.mixed_step_prefill_tokens, int) and self.mixed_step_prefill_tokens >= 1),
      "scheduler.mixed_step_prefill_tokens",
      f"must be null or an integer >= 1, got {self.mixed_step_prefill_tokens!r}",
    )
    latency = self.latency_batched_tokens
    _require(
      latency is None
      or (
        isinstance(latency, int)
        and not isinstance(latency, bool)
        and self.max_num_seqs <= latency <= self.max_num_batched_tokens
      ),
      "scheduler.latency_batched_tokens",
      f"must be null or an integer in [max_num_seqs ({self.max_num_seqs}), "
      f"max_num_batched_tokens ({self.max_num_batched_tokens})], got {latency!r}",
    )
    for name in ("seq_buckets", "token_buckets"):
      value = getattr(self, name)
      if value is not None:
        value = tuple(value)
        object.__setattr__(self, name, value)
        _require(
          len(value) > 0
          and all(isinstance(v, int) and v > 0 for v in value)
          and list(value) == sorted(set(value)),
          f"scheduler.{name}",
          f"must be a strictly increasing list of positive integers, got {value!r}",
        )
    if self.seq_buckets is not None:
      _require(
        self.seq_buckets[-1] >= self.max_num_seqs,
        "scheduler.seq_buckets",
        f"largest bucket must be >= max_num_seqs ({self.max_num_seqs})",
      )
    if self.token_buckets is not None:
      _require(
        self.token_buckets[-1] >= self.max_num_batched_tokens,
        "scheduler.token_buckets",
        f"largest bucket must be >= max_num_batched_tokens ({self.max_num_batched_tokens})",
      )
