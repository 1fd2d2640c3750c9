"""Orbax save/restore of a converted params tree, so a model restarts without reconverting.

`save_params` writes the tree with orbax's StandardCheckpointer (OCDBT + tensorstore); the call
returns once the checkpoint is committed. `restore_params` needs the abstract tree (`like`, e.g.
`weights.param_shapes(config)` or a tree of arrays): it fixes the structure, shapes and dtypes, and,
where leaves carry a sharding, where each array lands. A restore logs its GB and GB/s (waiting for
the arrays, so the rate is the real one).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from jaxserve.models.weight_transfer import TransferStats

logger = logging.getLogger(__name__)


def save_params(params: dict, directory: str | Path, *, overwrite: bool = False) -> Path:
  """Writes `params` to `directory` (must not exist unless overwrite). Returns the absolute path."""
  directory = Path(directory).absolute()
  if directory.exists() and not overwrite:
    raise ValueError(f"{directory}: checkpoint directory already exists")
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(directory, params, force=overwrite)
    checkpointer.wait_until_finished()
  return directory


def restore_params(directory: str | Path, like: dict) -> dict:
  """Reads a tree saved by `save_params`, shaped and typed like the abstract tree `like`."""
  directory = Path(directory).absolute()
  if not directory.is_dir():
    raise ValueError(f"{directory}: checkpoint directory not found")
  abstract = jax.tree.map(_abstract_leaf, like)
  start = time.perf_counter()
  with ocp.StandardCheckpointer() as checkpointer:
    try:
      params = jax.block_until_ready(checkpointer.restore(directory, abstract))
    except (ValueError, KeyError, FileNotFoundError) as err:
      raise ValueError(f"{directory}: cannot restore params: {err}") from err
  num_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
  stats = TransferStats(num_bytes, time.perf_counter() - start)
  logger.info("weights: %s from orbax %s", stats.describe(), directory)
  return params


def _abstract_leaf(leaf) -> jax.ShapeDtypeStruct:
  if isinstance(leaf, jax.ShapeDtypeStruct):
    return leaf
  sharding = getattr(leaf, "sharding", None)
  return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
