"""The soak's calls and their times, drawn lazily from a seed (`calls`).

Poisson arrivals at `rate` a second over `duration_s`: a canary every `canary_every_s`, else a
bad input (`bad_share`) or a good call from the mix (soak_catalogue.py), a streamed one that
leaves after 1 to 4 chunks for `cancel_share`. The draw is a function of the spec alone, so each
client process (soak_workers.py) draws the same sequence and sends its own share of it (every
n-th call): ten minutes at hundreds of calls a second, prompts near max_model_len among them, is
never held in memory or sent between processes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from jaxserve.bench.soak_catalogue import (
  ServedModel,
  SoakRequest,
  bad_inputs,
  canary,
  good_request,
)


@dataclass(frozen=True)
class ScheduleSpec:
  model: ServedModel
  rate: float  # arrivals per second
  duration_s: float
  seed: int
  max_tokens: int
  cancel_share: float
  bad_share: float
  canary_every_s: float


def _next_call(rng: random.Random, spec: ScheduleSpec, bad: list[SoakRequest]) -> SoakRequest:
  if rng.random() < spec.bad_share:
    return rng.choice(bad)
  request = good_request(rng, spec.model, spec.max_tokens)
  if rng.random() < spec.cancel_share:
    while not request.stream:
      request = good_request(rng, spec.model, spec.max_tokens)
    return SoakRequest(**{**asdict(request), "cancel_after": rng.randint(1, 4)})
  return request


def calls(spec: ScheduleSpec) -> Iterator[tuple[float, SoakRequest]]:
  """(seconds after the start, call), in time order."""
  if spec.rate <= 0:
    raise ValueError(f"rate: must be > 0, got {spec.rate}")
  rng, bad = random.Random(spec.seed), bad_inputs(spec.model)
  at, next_canary = 0.0, 0.0
  while True:
    at += rng.expovariate(spec.rate)
    if at >= spec.duration_s:
      return
    if at >= next_canary:
      request, next_canary = canary(spec.model), next_canary + spec.canary_every_s
    else:
      request = _next_call(rng, spec, bad)
    yield at, request
