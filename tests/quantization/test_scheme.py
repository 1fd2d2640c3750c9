"""The scheme table: one owner of the names (config's choices are these), one-line errors."""

from __future__ import annotations

import pytest

from jaxserve.cli import main
from jaxserve.config import CHOICES, EngineConfig
from jaxserve.quantization.scheme import (
  QUANTIZATION_NAMES,
  SCHEMES,
  QuantScheme,
  check_quantization,
  scheme_for,
  scheme_named,
)


def test_the_table():
  assert QUANTIZATION_NAMES == ("none", "fp8", "fp8_w8a16", "int8", "int8_w8a8")
  assert scheme_for("none") is None
  fp8, int8 = scheme_for("fp8"), scheme_for("int8")
  assert (fp8.weight_dtype, fp8.max_value, fp8.quantize_activations) == ("float8_e4m3fn", 448, True)
  assert (int8.weight_dtype, int8.max_value, int8.quantize_activations) == ("int8", 127, False)
  assert scheme_for("fp8_w8a16").quantize_activations is False
  assert scheme_for("int8_w8a8").quantize_activations is True
  for scheme in SCHEMES.values():
    assert scheme_named(scheme.weight_dtype, scheme.quantize_activations) is scheme
  assert fp8.describe() == "fp8 (fp8 e4m3 weights, W8A8)"


def test_config_offers_the_same_names():
  assert CHOICES["quantization"] is QUANTIZATION_NAMES
  assert EngineConfig().quantization == "none"
  assert EngineConfig(quantization="int8_w8a8").quantization == "int8_w8a8"


@pytest.mark.parametrize("bad", ["fp4", "", None, "FP8", "awq"])
def test_an_unknown_name_is_one_line_naming_it(bad):
  with pytest.raises(ValueError) as err:
    check_quantization(bad)
  message = str(err.value)
  assert message.startswith("quantization: must be one of") and repr(bad) in message
  assert "\n" not in message
  with pytest.raises(ValueError, match="^quantization: must be one of"):
    EngineConfig(quantization=bad)


def test_a_scheme_is_validated():
  with pytest.raises(ValueError, match="^quantization.weight_dtype: must be one of"):
    QuantScheme("x", "int4", False)
  with pytest.raises(ValueError, match="^quantization: no scheme with int8 weights"):
    scheme_named("int8", "yes")


def test_quantized_weights_shard_but_refuse_the_untested_modes():
  EngineConfig(quantization="fp8", tensor_parallel_size=2)  # sharded (partition_rules)
  for fields, name in (({"tp_invariant_reductions": True}, "tp_invariant_reductions"),):
    with pytest.raises(ValueError, match=f"^quantization: fp8 weights do not run with {name} yet$"):
      EngineConfig(quantization="fp8", **fields)
  EngineConfig(tensor_parallel_size=2)  # unquantized: as before


@pytest.mark.parametrize("name", ["fp8", "int8"])
def test_batch_invariant_is_refused_with_a_scheme_in_one_line(name):
  with pytest.raises(ValueError) as err:
    EngineConfig(quantization=name, batch_invariant=True)
  message = str(err.value)
  assert message.startswith(f"batch_invariant: cannot be combined with quantization {name!r}")
  assert "\n" not in message
  assert EngineConfig(batch_invariant=True).batch_invariant  # unquantized: as before


def test_the_cli_refuses_an_unknown_name_with_exit_code_2(capsys):
  """As a flag (argparse's choices, from the same table) and as a config key."""
  with pytest.raises(SystemExit) as exit_info:
    main(["generate", "--quantization", "int4", "--prompt", "hi"])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
    "jaxserve generate: error: argument --quantization/-q: invalid choice: 'int4' "
    "(choose from 'none', 'fp8', 'fp8_w8a16', 'int8', 'int8_w8a8')"
  )
  assert main(["config", "--set", "quantization=int4"]) == 2
  assert capsys.readouterr().err.strip() == (
    f"jaxserve config: error: quantization: must be one of {QUANTIZATION_NAMES}, got 'int4'"
  )
