"""One owner per policy, checked on the source with `ast` (nothing is imported):

* each policy has one definition (KVPages, the token-id and length admission rules, the n > 1
  expansion and its seed + k, the built-in model table, the sampling row's layout, the step
  programs and the runner, the quantization names, the data-parallel routing rule, the count of
  HTTP requests waiting to start);
* outside messages/, a sampling row is read by column name, never by position;
* no decision by an attention backend's display name (callers read its capabilities);
* the ModelRunner is composed, never subclassed.

The import graph's rules (layers, the host side without jax, the seam) are
tests/architecture/'s.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.source_graph import (
  KERNELS,
  PACKAGE,
  ROOT,
  backend_name_tests,
  definitions,
  package_modules,
  parse,
  positional_row_reads,
  reads_sampling_rows,
  within,
)

TESTS = ROOT / "tests"


def test_no_decision_by_an_attention_backends_name():
  """Callers read a backend's capabilities (attention/capabilities.py), never its display name,
  which depends on the wrapping order."""
  found = [
    (str(path.relative_to(ROOT)), line)
    for root in (PACKAGE, KERNELS, TESTS)
    for path in sorted(root.rglob("*.py"))
    for line in backend_name_tests(parse(path))
  ]
  assert found == []


@pytest.mark.parametrize(
  "name,where",
  [
    ("KVPages", ["jaxserve.attention.metadata"]),
    ("check_token_ids", ["jaxserve.engine.admission"]),
    ("check_length", ["jaxserve.engine.admission"]),
    ("expand_n", ["jaxserve.api.sampling_params"]),
    ("BUILTIN_MODELS", ["jaxserve.models.builtin"]),
    ("build_step_programs", ["jaxserve.device.step_programs"]),
    ("ModelRunner", ["jaxserve.device.model_runner"]),
    ("ScheduledBatch", ["jaxserve.messages.scheduled_batch"]),
    ("KVLayout", ["jaxserve.messages.kv_layout"]),
    ("kv_groups", ["jaxserve.models.kv_layout"]),
    ("StepOutput", ["jaxserve.messages.step_output"]),
    ("SamplingColumn", ["jaxserve.messages.sampling_row"]),
    ("SAMPLING_ROW_WIDTH", ["jaxserve.messages.sampling_row"]),
    ("GREEDY_ROW", ["jaxserve.messages.sampling_row"]),
    ("sampling_row", ["jaxserve.messages.sampling_row"]),
    ("QUANTIZATION_NAMES", ["jaxserve.quantization.scheme"]),
    ("much_busier", ["jaxserve.core.dp_routing"]),
    ("PrefixAffinityRouter", ["jaxserve.core.dp_routing"]),
    ("plan_device_groups", ["jaxserve.core.device_groups"]),
    ("check_quantization", ["jaxserve.quantization.scheme"]),
    ("resolve_quantization", ["jaxserve.quantization.compressed_tensors"]),
    ("is_quantized_kernel", ["jaxserve.models.quantized_dense"]),
    ("kernel_shape", ["jaxserve.models.quantized_dense"]),
    ("output_axis", ["jaxserve.models.quantized_dense"]),
  ],
)
def test_one_definition_per_policy(name, where):
  assert definitions(name) == where


def test_sampling_rows_are_read_by_column_name():
  """The row's layout is messages/sampling_row.py's alone: nobody else indexes a row by
  position or restates its width (the batch builder, the request and the sampling inputs
  handle rows)."""
  readers = {
    module: parse(path)
    for module, path in package_modules().items()
    if not within(module, ("jaxserve.messages",))
  }
  readers = {m: tree for m, tree in readers.items() if reads_sampling_rows(tree)}
  assert {
    "jaxserve.engine.request",
    "jaxserve.engine.batch_builder",
    "jaxserve.device.sampling_inputs",
  } <= set(readers)
  assert {m: found for m, tree in readers.items() if (found := positional_row_reads(tree))} == {}


def test_one_seed_plus_k():
  """The n > 1 rule (child k samples with seed + k) is written once."""

  def adds_to_seed(node: ast.AST) -> bool:
    return (
      isinstance(node, ast.BinOp)
      and isinstance(node.op, ast.Add)
      and any(
        isinstance(side, ast.Attribute) and side.attr == "seed" for side in (node.left, node.right)
      )
    )

  found = [
    module
    for module, path in package_modules().items()
    for node in ast.walk(parse(path))
    if adds_to_seed(node)
  ]
  assert found == ["jaxserve.api.sampling_params"]


def waiting_limit_checks(path: Path) -> int:
  """Comparisons of a count with a max_waiting limit (server.max_waiting_requests or the
  limit an add carries), not validations against a constant."""

  def is_limit(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.startswith("max_waiting")

  found = 0
  for node in ast.walk(parse(path)):
    if isinstance(node, ast.Compare):
      sides = [node.left, *node.comparators]
      if any(is_limit(side) for side in sides) and not any(
        isinstance(side, ast.Constant) for side in sides
      ):
        found += 1
  return found


def test_one_count_of_waiting_http_requests():
  """Admission (server.max_waiting_requests) has one owner: the engine core's loop, for every
  API server at once; nothing else counts waiting HTTP requests against the limit."""
  found = {m: n for m, p in package_modules().items() if (n := waiting_limit_checks(p))}
  assert found == {"jaxserve.core.loop": 1}
  assert definitions("WaitingRequests") == definitions("try_admit") == []


def test_no_subclass_of_the_runner():
  subclasses = [
    (module, node.name)
    for module, path in package_modules().items()
    for node in ast.walk(parse(path))
    if isinstance(node, ast.ClassDef)
    and any(isinstance(b, ast.Name) and b.id == "ModelRunner" for b in node.bases)
  ]
  assert subclasses == []


def test_the_checks_catch_what_they_are_for():
  """The row and backend-name checks above fail on code that breaks them (so they cannot pass
  vacuously)."""
  positional = ast.parse(
    "table = np.frombuffer(batch.sampling.rows).reshape(n, 8)\n"
    "floats[:, 1] = 1.0\ntop_k = table[:, 6]\nseed = row[7]\nsize = table.shape[0]\n"
  )
  assert reads_sampling_rows(positional)
  assert positional_row_reads(positional) == [
    "np.frombuffer(batch.sampling.rows).reshape(n, 8)",
    "floats[:, 1]",
    "table[:, 6]",
    "row[7]",
  ]
  names = ast.parse(
    "if backend.name == 'xla': pass\n"
    "if b.name.startswith('pallas_gpu'): pass\n"
    "if 'pallas_gpu' in placement.attention.name: pass\n"
    "x = self.backend.name.endswith(suffix)\n"
    "y = arg.name == 'model' or m.name.startswith(('xla_cuda',))\n"
    "z = backend.capabilities.kind is BackendKind.XLA\n"
  )
  assert backend_name_tests(names) == [1, 2, 3, 4]
