"""The kernel keys as typed choices (jaxserve/config/kernel_choices.py): the config's strings
stay the user-facing values, EngineConfig.kernels parses them into enums, the enums carry what
callers decide by (the platform, the TPU kernel's 8-bit page sizes, the GEMM options, unsharded
only), and no module outside the choices compares a kernel's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jaxserve.attention.capabilities import BackendKind
from jaxserve.config import (
  ATTENTION_BACKENDS,
  CHOICES,
  AttentionChoice,
  CacheConfig,
  EngineConfig,
  GpuGemm,
  KernelChoice,
  KernelChoices,
)
from jaxserve.device.platform_needs import needed_platform

PACKAGE = Path(__file__).resolve().parents[2] / "jaxserve"
CHOICE_MODULE = PACKAGE / "config" / "kernel_choices.py"


def test_the_config_strings_are_the_enums_values():
  assert CHOICES["attention_backend"] == ("auto", "reference", "xla", "pallas_gpu", "pallas_tpu")
  assert CHOICES["gpu_gemm"] == ("cublas", "cublaslt", "xla")
  assert CHOICES["sampler_backend"] == CHOICES["quantized_gemm"] == ("auto", "xla", "pallas_gpu")
  # a built attention backend's kind is one of the choices (all but auto)
  assert {kind.value for kind in BackendKind} | {"auto"} == set(ATTENTION_BACKENDS)


def test_engine_config_parses_its_kernel_keys():
  config = EngineConfig(attention_backend="pallas_tpu", gpu_gemm="cublaslt", sampler_backend="xla")
  assert config.kernels == KernelChoices(
    AttentionChoice.PALLAS_TPU, GpuGemm.CUBLASLT, KernelChoice.XLA, KernelChoice.AUTO
  )
  assert config.gpu_gemm == "cublaslt"  # the user-facing value is kept as given
  assert EngineConfig().kernels == KernelChoices(
    AttentionChoice.AUTO, GpuGemm.CUBLAS, KernelChoice.AUTO, KernelChoice.AUTO
  )


def test_each_choice_says_what_callers_decide_by():
  assert [c.platform for c in AttentionChoice] == [None, None, None, "gpu", "tpu"]
  assert [c.kv_8bit_page_sizes for c in AttentionChoice] == [None] * 4 + [(32, 64)]
  assert [g.keeps_triton_gemms for g in GpuGemm] == [False, False, True]
  assert [g.through_cublaslt for g in GpuGemm] == [False, True, False]
  assert [k.unsharded_only for k in KernelChoice] == [False, False, True]
  assert needed_platform(EngineConfig(attention_backend="pallas_tpu")) == "tpu"
  assert needed_platform(EngineConfig(attention_backend="xla")) is None


@pytest.mark.parametrize(
  "overrides, field",
  [
    ({"quantized_gemm": "triton"}, "quantized_gemm"),
    ({"quantized_gemm": "pallas_gpu", "tensor_parallel_size": 2}, "quantized_gemm"),
    ({"sampler_backend": "pallas_gpu", "tensor_parallel_size": 2}, "sampler_backend"),
    ({"attention_backend": "pallas_tpu", "cache": CacheConfig(16, kv_cache_dtype="fp8")}, "cache"),
  ],
)
def test_a_refused_choice_names_its_key(overrides, field):
  with pytest.raises(ValueError, match=rf"^{field}"):
    EngineConfig(**overrides)


def name_comparisons(tree: ast.Module, names: set[str]) -> list[int]:
  """Lines comparing something with (==, !=, in, not in) a kernel choice's string."""
  lines = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare):
      operands = [node.left, *node.comparators]
      strings = set()
      for operand in operands:
        items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
        strings |= {i.value for i in items if isinstance(i, ast.Constant)}
      if strings & names:
        lines.append(node.lineno)
  return sorted(set(lines))


KERNEL_NAMES = {"pallas_gpu", "pallas_tpu", "cublas", "cublaslt"}


def test_no_decision_by_a_kernel_choices_name():
  """Outside kernel_choices.py no jaxserve module compares a value with a Pallas kernel's or a
  GEMM library's name (the attention backends' factories are keyed by name in
  attention/backends.py, the one place a name becomes a backend)."""
  found = [
    f"{path.relative_to(PACKAGE)}:{line}"
    for path in sorted(PACKAGE.rglob("*.py"))
    if path != CHOICE_MODULE
    for line in name_comparisons(ast.parse(path.read_text()), KERNEL_NAMES)
  ]
  assert found == []


def test_the_name_rule_catches_what_it_is_for():
  tree = ast.parse(
    "if config.gpu_gemm != 'xla' and config.gpu_gemm == 'cublaslt': pass\n"
    "x = backend in ('auto', 'pallas_gpu')\n"
    "y = name == 'xla'\n"
  )
  assert name_comparisons(tree, KERNEL_NAMES) == [1, 2]
