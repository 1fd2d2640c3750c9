"""Request arrival times for the serving benchmark, as vLLM's benchmark_serving draws them.

Gaps between requests are gamma-distributed with shape `burstiness` and scale
1 / (rate * burstiness), so the mean gap is 1 / rate whatever the burstiness: burstiness 1 is a
Poisson process, smaller is burstier, larger is more regular. An infinite rate sends everything at
once (all gaps zero).
"""

from __future__ import annotations

import math

import numpy as np


def arrival_gaps(
  num_requests: int, request_rate: float, burstiness: float = 1.0, seed: int = 0
) -> np.ndarray:
  """Seconds to wait after each request before sending the next one. [num_requests]"""
  if not request_rate > 0:
    raise ValueError(f"request_rate: must be > 0 (or inf), got {request_rate}")
  if not burstiness > 0:
    raise ValueError(f"burstiness: must be > 0, got {burstiness}")
  if math.isinf(request_rate):
    return np.zeros(num_requests)
  theta = 1.0 / (request_rate * burstiness)
  return np.random.default_rng(seed).gamma(shape=burstiness, scale=theta, size=num_requests)


def send_offsets(gaps: np.ndarray) -> np.ndarray:
  """When each request is sent, in seconds from the start (the first goes at 0). [num_requests]"""
  return np.concatenate([[0.0], np.cumsum(gaps)[:-1]]) if len(gaps) else np.zeros(0)
