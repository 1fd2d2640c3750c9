"""investigations/mixed_steps_sim.py: the real scheduler through a small burst under its step-time
model. The ITL median is a decode-only step either way; without the setting the steps that carry a
whole budget of prompt tokens set the ITL tail, with it the tail is a step with at most the cap's
(or the idle slots' share of the budget's) prompt tokens, and the burst takes a little longer."""

from __future__ import annotations

import pytest

from investigations.mixed_steps_sim import Burst, StepModel, simulate

BURST = Burst(
  num_requests=64, input_len=32, output_len=32, max_num_seqs=16, max_num_batched_tokens=256
)


def test_a_cap_shortens_the_itl_tail_for_a_little_throughput():
  model = StepModel()
  free, capped = simulate(BURST, None, model), simulate(BURST, 16, model)
  decode_only = model.step_ms(16, 0)
  assert free["itl_p50"] == pytest.approx(decode_only) == capped["itl_p50"]
  assert free["itl_p99"] == pytest.approx(model.step_ms(15, 256 - 15), rel=0.01)  # a full budget
  assert decode_only < capped["itl_p99"] < free["itl_p99"]
  assert 0.9 * free["tok_s"] < capped["tok_s"] < free["tok_s"]
