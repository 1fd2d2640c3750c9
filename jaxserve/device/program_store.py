"""Compiled step programs kept across restarts and found without tracing them (config key
`compilation_cache_dir`; device/program_compiler.py uses it).

JAX's persistent compilation cache is keyed by the lowered module, so a restart that finds every
program there still traces and lowers each one, which is most of a warm restart's time. The
program store keys a compiled program by what determines it, without tracing:

- the build: STORE_FORMAT, the jax and jaxlib versions, the backend's platform and version and
  the devices' kinds;
- the code: a digest of every file of the jaxserve package (`source_digest`);
- the environment variables that steer XLA, JAX, libtpu or jaxserve (ENV_PREFIXES);
- the engine: a description its builder gives (the engine's resolved config and the model's);
- the program: its name (kind, bucket, sampler mode) and the pytree structure, shapes, dtypes
  and shardings of its arguments (the params and KV pages included).

The first four make the store's fingerprint, a folder `<root>/<fingerprint>/` (its
FINGERPRINT_FILE says them in words); the last names a file in it. A compiled program is
serialized with its argument and result trees (jax.experimental.serialize_executable), written
to a temporary file and renamed (so a reader never sees half a file, and processes sharing the
folder, data-parallel cores, do not clash), and read back with deserialize_and_load. A file
that does not read back is a miss: logged, removed, and the program is lowered and compiled as
without a store. A program whose executable takes constants beside its arguments is not stored
(deserialize_and_load gives none back), nor one XLA's persistent cache gave back (the
compiler's rule: such an executable does not always serialize whole). Opening a store marks its
folder used and removes all but the KEEP most recently used fingerprints under the root.

One process only: a multi-host job's programs are compiled by every host together, so the
builder opens no store there.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jax
from jax.experimental import serialize_executable

logger = logging.getLogger(__name__)

STORE_FORMAT = 1
KEEP = 4  # fingerprint folders kept under the root, the most recently used
ENV_PREFIXES = ("XLA_", "JAX_", "LIBTPU", "TPU_", "JAXSERVE_", "NVIDIA_TF32", "CUDA_VISIBLE")
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # jaxserve/
SUFFIX = ".exe"
FINGERPRINT_FILE = "FINGERPRINT.txt"


def source_digest(package_dir: Path = PACKAGE_DIR) -> str:
  """sha256 of every file under `package_dir` (relative path and bytes; compiled bytecode left
  out): any change to the code that builds a program changes it."""
  digest = hashlib.sha256()
  for path in sorted(package_dir.rglob("*")):
    if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
      digest.update(str(path.relative_to(package_dir)).encode() + b"\0")
      digest.update(path.read_bytes())
  return digest.hexdigest()


def build_description() -> str:
  """The versions, backend and devices a compiled program belongs to."""
  devices = jax.devices()
  return repr(
    (
      STORE_FORMAT,
      jax.__version__,
      jax.lib.__version__,
      devices[0].client.platform,
      devices[0].client.platform_version,
      sorted({d.device_kind for d in devices}),
      len(devices),
    )
  )


def environment_description(environ: dict[str, str] | None = None) -> str:
  """The variables (ENV_PREFIXES) that can change what XLA compiles."""
  environ = dict(os.environ if environ is None else environ)
  return repr(sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIXES)))


def argument_signature(args: object) -> str:
  """The pytree structure of `args` (jax.ShapeDtypeStruct leaves, device/lowering.abstract) and
  every leaf's shape, dtype and sharding."""
  leaves, tree = jax.tree.flatten(args)
  parts = [str(tree)]
  parts += [f"{leaf.shape}|{leaf.dtype}|{leaf.sharding}" for leaf in leaves]
  return "\n".join(parts)


@dataclass(frozen=True)
class ProgramStore:
  """One fingerprint's folder of compiled programs (module docstring)."""

  directory: Path

  @classmethod
  def open(cls, root: str | Path, engine_description: str) -> ProgramStore:
    """The store of this build, code, environment and engine under `root` (created)."""
    parts = {
      "build": build_description(),
      "code": source_digest(),
      "environment": environment_description(),
      "engine": engine_description,
    }
    text = "".join(f"[{name}]\n{value}\n" for name, value in parts.items())
    directory = Path(root).expanduser() / hashlib.sha256(text.encode()).hexdigest()[:24]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / FINGERPRINT_FILE).write_text(text)  # what the folder's programs belong to
    os.utime(directory)
    root = directory.parent
    _prune(root, KEEP)
    return cls(directory)

  def path(self, name: str, args: object) -> Path:
    """The file of the program `name` on arguments `args` (abstract)."""
    key = hashlib.sha256(f"{name}\n{argument_signature(args)}".encode()).hexdigest()[:32]
    return self.directory / f"{key}{SUFFIX}"

  def holds(self, name: str, args: object) -> bool:
    """Whether a file of (name, args) is stored (it may still fail to load)."""
    return self.path(name, args).exists()

  def load(self, name: str, args: object) -> jax.stages.Compiled | None:
    """The stored compiled program, or None (absent, or unreadable: then removed)."""
    path = self.path(name, args)
    if not path.exists():
      return None
    try:
      payload, in_tree, out_tree = pickle.loads(path.read_bytes())
      return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
    except Exception as err:  # a stale or damaged file is a miss, never a failed start
      logger.warning(
        "program store: %s did not load (%s: %s); compiling it", name, type(err).__name__, err
      )
      path.unlink(missing_ok=True)
      return None

  def save(self, name: str, args: object, compiled: jax.stages.Compiled) -> None:
    """Writes `compiled` for (name, args); a failure to serialize or write is logged, not
    raised (the program is compiled either way)."""
    params = getattr(compiled, "_params", None)  # jax.stages.Compiled's call parameters
    if params is None or getattr(params, "const_args", None):
      logger.info("program store: %s is not stored (it takes constants beside its arguments)", name)
      return
    path = self.path(name, args)
    try:
      data = pickle.dumps(serialize_executable.serialize(compiled))
      with tempfile.NamedTemporaryFile(dir=self.directory, suffix=".tmp", delete=False) as f:
        f.write(data)
      os.replace(f.name, path)
    except Exception as err:
      logger.warning("program store: %s was not stored (%s: %s)", name, type(err).__name__, err)

  def num_programs(self) -> int:
    return sum(1 for _ in self.directory.glob(f"*{SUFFIX}"))


def _prune(root: Path, keep: int) -> None:
  """Removes all but the `keep` most recently used fingerprint folders under `root`."""
  folders = sorted(
    (p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True
  )
  for old in folders[keep:]:
    shutil.rmtree(old, ignore_errors=True)


def engine_description(*parts: object) -> str:
  """The engine's part of the fingerprint: the reprs of its resolved configs."""
  return "\n".join(repr(part) for part in parts)
