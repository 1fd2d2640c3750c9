"""A Hugging Face config.json dict mapped onto a ModelConfig (models/hf_config_json.py writes
one back): `model_config_from_hf(d, dtype)`.

The registry (models/families/) picks the family by the `architectures` entry (else the
`model_type`); the family's module reads its fields (with the shared readers of
models/hf_fields.py) and refuses, naming it, any field its code does not implement, so an
unsupported checkpoint fails at load time rather than producing wrong logits; the result is
checked against the family's rules (`family_of`). dtype "auto" takes the checkpoint's (float16 ->
bfloat16).
"""

from __future__ import annotations

from collections.abc import Mapping

from jaxserve.config.require import require as _require
from jaxserve.models.families import family_of, resolve_hf
from jaxserve.models.model_config import DTYPES, ModelConfig

_HF_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "bfloat16"}


def model_config_from_hf(d: Mapping, dtype: str = "auto") -> ModelConfig:
  """Maps a Hugging Face config.json dict. dtype "auto" takes the checkpoint's (float16 ->
  bfloat16); otherwise "float32" or "bfloat16"."""
  architecture, family = resolve_hf(d)
  fields = family.config_fields(d, architecture)
  config = ModelConfig(architecture=architecture, **fields, dtype=_hf_dtype(d, dtype))
  family_of(config)
  return config


def _hf_dtype(d: Mapping, dtype: str) -> str:
  if dtype != "auto":
    _require(dtype in DTYPES, "dtype", f"must be 'auto' or one of {DTYPES}, got {dtype!r}")
    return dtype
  hf_dtype = d.get("dtype") or d.get("torch_dtype") or "float32"
  _require(
    hf_dtype in _HF_DTYPES,
    "dtype",
    f"unsupported checkpoint dtype {hf_dtype!r} (supported: {', '.join(_HF_DTYPES)})",
  )
  return _HF_DTYPES[hf_dtype]
