"""Kernels are platform first (pallas_kernels/__init__.py's docstring), checked on the source with
`ast` like tests/test_architecture.py's rules:

* no kernel package keeps a platform-prefixed module (gpu_*.py, tpu_*.py) at its top level: a
  kernel of one platform has a single `<platform>.py`, a kernel of several a subpackage per
  platform (ragged_paged_attention/gpu/, ragged_paged_attention/tpu/), never both platforms as
  top-level modules;
* a platform's modules import no other platform's modules (gpu/ never imports tpu/, nor the
  reverse, in any kernel);
* a kernel's shared modules (reference, validation, the KV format, tiling, test helpers) import
  no platform's modules: every platform builds on them, not they on one. In a kernel of one
  platform, kept flat (greedy_sample/gpu.py beside reference.py), every module but the shared
  ones (SHARED) is that platform's: grouped_matmul's fp8.py, routing.py and routed.py are GPU
  kernels beside gpu.py, which its reference.py and tiles.py must not import.
"""

from __future__ import annotations

from pathlib import Path

from tests.source_graph import KERNELS, import_graph

PLATFORMS = ("gpu", "tpu")
# what every platform of a kernel builds on: references, checks, formats, tilings, test helpers
SHARED = ("reference", "validate", "kv_quant", "tiles", "testing", "__init__")


def kernel_packages(root: Path) -> list[Path]:
  return sorted(p for p in root.iterdir() if (p / "__init__.py").is_file())


def misplaced_platform_modules(root: Path) -> list[str]:
  """Each kernel package's top-level platform modules that break the layout, as
  "<kernel>/<file>: why"."""
  found = []
  for kernel in kernel_packages(root):
    top = {p.stem for p in kernel.glob("*.py")}
    subpackages = {p.name for p in kernel.iterdir() if (p / "__init__.py").is_file()}
    prefixed = sorted(m for m in top if m.startswith(tuple(f"{p}_" for p in PLATFORMS)))
    outside = "a platform module outside its platform's folder"
    found += [f"{kernel.name}/{m}.py: {outside}" for m in prefixed]
    single = sorted(p for p in PLATFORMS if p in top)
    if len(single) + len(subpackages & set(PLATFORMS)) > 1:
      found += [f"{kernel.name}/{p}.py: several platforms, so one folder each" for p in single]
  return found


def platform_of(module: str) -> str | None:
  """gpu for pallas_kernels.<kernel>.gpu and everything under it, likewise tpu; in a flat kernel
  of one platform (its <platform>.py beside the shared modules) every module but SHARED; None
  for a kernel's shared modules."""
  parts = module.split(".")
  if len(parts) <= 2:
    return None
  if parts[2] in PLATFORMS:
    return parts[2]
  kernel = KERNELS / parts[1]
  flat = [p for p in PLATFORMS if (kernel / f"{p}.py").is_file()]
  return flat[0] if len(flat) == 1 and parts[2] not in SHARED else None


def cross_platform_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
  """(importer, imported) pairs where a platform's module, or a shared module, imports a module
  of another platform (of any kernel)."""
  edges = []
  for module, targets in graph.items():
    if not module.startswith("pallas_kernels."):
      continue
    mine = platform_of(module)
    for target in targets:
      theirs = platform_of(target) if target.startswith("pallas_kernels.") else None
      same_kernel = module.split(".")[:2] == target.split(".")[:2]
      if theirs is not None and theirs != mine and (mine is not None or same_kernel):
        edges.append((module, target))
  return sorted(edges)


def test_no_platform_module_at_a_kernel_packages_top_level():
  assert misplaced_platform_modules(KERNELS) == []


def test_the_attention_kernel_has_a_folder_per_platform():
  attention = KERNELS / "ragged_paged_attention"
  for platform in PLATFORMS:
    assert (attention / platform / "__init__.py").is_file()
    assert (attention / platform / "attention.py").is_file()


def test_no_platform_imports_another_nor_a_shared_module_a_platform():
  assert cross_platform_imports(import_graph(KERNELS)) == []


def test_the_layout_rules_catch_what_they_are_for(tmp_path):
  """The checks above fail on a kernels tree that breaks them (so they cannot pass vacuously):
  the layout before platform first (gpu.py beside gpu_tiling.py and tpu.py), and imports across
  platforms."""
  root = tmp_path / "pallas_kernels"
  kernel = root / "attention"
  for folder in (root, kernel, kernel / "tpu"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")
  (kernel / "gpu.py").write_text("from pallas_kernels.attention.tpu import kernel\n")
  (kernel / "gpu_tiling.py").write_text("")
  (kernel / "reference.py").write_text("from pallas_kernels.attention import gpu\n")
  (kernel / "tpu" / "kernel.py").write_text("from pallas_kernels.attention.gpu_tiling import x\n")
  assert misplaced_platform_modules(root) == [
    "attention/gpu_tiling.py: a platform module outside its platform's folder",
    "attention/gpu.py: several platforms, so one folder each",
  ]
  assert cross_platform_imports(import_graph(root)) == [
    ("pallas_kernels.attention.gpu", "pallas_kernels.attention.tpu"),
    ("pallas_kernels.attention.gpu", "pallas_kernels.attention.tpu.kernel"),
    ("pallas_kernels.attention.reference", "pallas_kernels.attention.gpu"),
  ]
