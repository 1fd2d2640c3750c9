"""Imports are explicit: no __import__ or importlib.import_module anywhere in jaxserve/, so every
edge is in the import graph the other rules read."""

from __future__ import annotations

import ast

from tests.source_graph import package_modules, parse


def test_imports_are_explicit():
  """No __import__ or importlib.import_module: a module that fails to import must fail loudly
  (the CLI once dropped a subcommand whose import failed) and every edge is in the graph."""
  dynamic = [
    module
    for module, path in package_modules().items()
    for node in ast.walk(parse(path))
    if isinstance(node, ast.Call)
    and (
      (isinstance(node.func, ast.Name) and node.func.id == "__import__")
      or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
    )
  ]
  assert dynamic == []
