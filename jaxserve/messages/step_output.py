"""The one message from the device side back to the host side: a step's results.

Plain numpy arrays on the host (no jax), so, like ScheduledBatch, it can cross a process
boundary as it is. The optional parts are None when no request of the step asked for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepOutput:
  """A step's results on the host, rows in the ScheduledBatch's sequence order. A decode
  burst's token_ids and logprobs are [num_steps, S]."""

  token_ids: np.ndarray  # i32[S] ([num_steps, S] for a burst)
  logprobs: np.ndarray  # f32[S] ([num_steps, S] for a burst)
  top_ids: np.ndarray | None  # i32[S, N]
  top_logprobs: np.ndarray | None  # f32[S, N]
  prompt_logprobs: np.ndarray | None  # f32[T]
  prompt_top_ids: np.ndarray | None  # i32[T, N]
  prompt_top_logprobs: np.ndarray | None  # f32[T, N]
