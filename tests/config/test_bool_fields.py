"""Every true/false setting of the config tree refuses a non-bool (a YAML "yes" read as a string,
a 1) with one ValueError naming the field by its dotted key."""

from __future__ import annotations

import pytest

from jaxserve.config.loader import load_config

BOOL_KEYS = [
  "enable_expert_parallel",
  "tp_invariant_reductions",
  "batch_invariant",
  "fuse_projections",
  "scheduler.prefill_first",
  "scheduler.pool_seq_rungs",
  "scheduler.async_scheduling",
  "distributed.enabled",
]


@pytest.mark.parametrize("key", BOOL_KEYS)
@pytest.mark.parametrize("value", ["'yes'", "1"])
def test_a_non_bool_is_refused_by_name(key, value):
  with pytest.raises(ValueError, match=rf"^{key}: must be true or false, got {value}$"):
    load_config(None, [f"{key}={value}"])


@pytest.mark.parametrize("key", BOOL_KEYS)
def test_a_bool_is_taken(key):
  assert load_config(None, [f"{key}=false"]) is not None
