"""On a multi-host job a request's own device arrays cannot reach the other hosts
(parallel/step_codec.py sends constant device arrays only): a logit bias or a penalty is refused
at admission with a ValueError naming the field, instead of failing the step that publishes it."""

from __future__ import annotations

import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.engine.admission import check_multi_host_sampling


@pytest.mark.parametrize(
  "field, value",
  [
    ("logit_bias", {5: 1.0}),
    ("repetition_penalty", 1.2),
    ("presence_penalty", 0.5),
    ("frequency_penalty", -0.5),
  ],
)
def test_per_request_device_data_is_refused_naming_the_field(field, value):
  with pytest.raises(ValueError, match=rf"^{field}: not supported on a multi-host job"):
    check_multi_host_sampling(SamplingParams(**{field: value}))


def test_plain_sampling_is_admitted():
  check_multi_host_sampling(SamplingParams(temperature=0.7, top_k=5, logprobs=3, min_tokens=2))
