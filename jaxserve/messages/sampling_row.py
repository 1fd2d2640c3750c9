"""One sequence's sampling row: the sampling scalars a step needs for a sequence, fixed for as long
as it runs. Pure Python, no jax.

A row is SAMPLING_ROW_WIDTH native float64 values (each one exact in float64) in the order of
`SamplingColumn`; this module is the layout's one definition. The host side builds a request's
row once (`sampling_row`, cached on the Request) and joins a batch's rows into
BatchSampling.rows as bytes, without touching the values; the device side reads the joined rows
as one [S, SAMPLING_ROW_WIDTH] table and takes each column by its name (device/step_inputs.py).
Nobody else indexes a row by position (tests/test_one_owner.py checks it).

GREEDY_ROW samples greedily with nothing cut and no penalty: the row of a batch built from
sequences alone and of the padding slots of a step.
"""

from __future__ import annotations

import enum
from array import array


class SamplingColumn(enum.IntEnum):
  """The columns of a sampling row, in order."""

  TEMPERATURE = 0  # 0: greedy
  TOP_P = 1  # 1: no cut
  MIN_P = 2  # 0: no cut
  REPETITION_PENALTY = 3  # 1: none
  PRESENCE_PENALTY = 4  # 0: none
  FREQUENCY_PENALTY = 5  # 0: none
  TOP_K = 6  # <= 0: no cut
  SEED = 7  # the request's seed folded to 32 bits (a uint32)


SAMPLING_ROW_WIDTH = len(SamplingColumn)  # float64 values per sequence


def sampling_row(
  *,
  temperature: float,
  top_p: float,
  min_p: float,
  repetition_penalty: float,
  presence_penalty: float,
  frequency_penalty: float,
  top_k: int,
  seed: int,
) -> bytes:
  """One sequence's row, from its values by name (seed: any int, folded to 32 bits)."""
  values = {
    SamplingColumn.TEMPERATURE: temperature,
    SamplingColumn.TOP_P: top_p,
    SamplingColumn.MIN_P: min_p,
    SamplingColumn.REPETITION_PENALTY: repetition_penalty,
    SamplingColumn.PRESENCE_PENALTY: presence_penalty,
    SamplingColumn.FREQUENCY_PENALTY: frequency_penalty,
    SamplingColumn.TOP_K: top_k,
    SamplingColumn.SEED: (seed ^ (seed >> 32)) & 0xFFFFFFFF,
  }
  return array("d", [values[column] for column in SamplingColumn]).tobytes()


GREEDY_ROW = sampling_row(
  temperature=0.0,
  top_p=1.0,
  min_p=0.0,
  repetition_penalty=1.0,
  presence_penalty=0.0,
  frequency_penalty=0.0,
  top_k=0,
  seed=0,
)
