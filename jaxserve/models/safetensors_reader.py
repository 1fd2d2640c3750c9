"""A zero-copy safetensors reader: the header parsed with json, tensors as numpy views of an mmap.

The format: 8 bytes little-endian u64 N, then N bytes of JSON mapping every tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte after the header;
an optional "__metadata__" entry maps strings to strings), then the raw little-endian tensor bytes.

`read_header(path)` reads and validates only the header (a few KiB, so a loader can check every
tensor's name and shape before moving a byte of weights). `MappedFile.open(path)` maps the whole
file read-only; `view(info)` is a numpy array over the mapping's pages, with no copy: the bytes
stay in the page cache and are read by whoever consumes the view (a device transfer). Opening
asks the kernel to populate the mapping (MAP_POPULATE, else madvise WILLNEED) so a reader thread
can fault a file in while an earlier one is still being transferred.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

MAX_HEADER_BYTES = 100 << 20  # the reference implementation's limit
DTYPES: Mapping[str, np.dtype] = {
  "BOOL": np.dtype(np.bool_),
  "U8": np.dtype("u1"),
  "I8": np.dtype("i1"),
  "U16": np.dtype("<u2"),
  "I16": np.dtype("<i2"),
  "U32": np.dtype("<u4"),
  "I32": np.dtype("<i4"),
  "U64": np.dtype("<u8"),
  "I64": np.dtype("<i8"),
  "F16": np.dtype("<f2"),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "F32": np.dtype("<f4"),
  "F64": np.dtype("<f8"),
  "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
  "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}


@dataclass(frozen=True)
class TensorInfo:
  """One tensor of a file: dtype, shape and absolute byte range [begin, end)."""

  name: str
  dtype: np.dtype
  shape: tuple[int, ...]
  begin: int
  end: int

  @property
  def nbytes(self) -> int:
    return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
  path: Path
  tensors: Mapping[str, TensorInfo]
  metadata: Mapping[str, str]
  file_size: int


def read_header(path: Path) -> SafetensorsHeader:
  """Parses and validates `path`'s header; errors are ValueError naming the file."""
  path = Path(path)
  with open(path, "rb") as f:
    file_size = f.seek(0, 2)
    f.seek(0)
    prefix = f.read(8)
    if len(prefix) < 8:
      raise ValueError(f"{path}: not a safetensors file ({file_size} bytes, no header length)")
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_HEADER_BYTES or 8 + length > file_size:
      raise ValueError(
        f"{path}: invalid safetensors header length {length} (file has {file_size} bytes)"
      )
    raw = f.read(length)
  try:
    entries = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ValueError(f"{path}: invalid safetensors header JSON: {err}") from err
  if not isinstance(entries, dict):
    raise ValueError(f"{path}: invalid safetensors header: not a JSON object")
  metadata = entries.pop("__metadata__", None) or {}
  data_start = 8 + length
  tensors = {
    name: _tensor_info(path, name, entry, data_start, file_size) for name, entry in entries.items()
  }
  return SafetensorsHeader(path, tensors, metadata, file_size)


def _tensor_info(
  path: Path, name: str, entry: object, data_start: int, file_size: int
) -> TensorInfo:
  def bad(why: str) -> ValueError:
    return ValueError(f"{path}: tensor {name!r}: {why}")

  if not isinstance(entry, dict):
    raise bad("header entry is not an object")
  dtype = DTYPES.get(entry.get("dtype"))
  if dtype is None:
    raise bad(f"unsupported dtype {entry.get('dtype')!r}")
  shape, offsets = entry.get("shape"), entry.get("data_offsets")
  if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
    raise bad(f"invalid shape {shape!r}")
  if (
    not isinstance(offsets, list)
    or len(offsets) != 2
    or not all(isinstance(o, int) for o in offsets)
    or not 0 <= offsets[0] <= offsets[1]
  ):
    raise bad(f"invalid data_offsets {offsets!r}")
  begin, end = data_start + offsets[0], data_start + offsets[1]
  if end - begin != math.prod(shape) * dtype.itemsize:
    raise bad(
      f"data_offsets {offsets} hold {end - begin} bytes, shape {shape} of "
      f"{entry['dtype']} needs {math.prod(shape) * dtype.itemsize}"
    )
  if end > file_size:
    raise bad(f"data ends at byte {end}, past the end of the file ({file_size} bytes)")
  return TensorInfo(name, dtype, tuple(shape), begin, end)


@dataclass(frozen=True)
class MappedFile:
  """A read-only mapping of one safetensors file (closed when the last view is gone)."""

  header: SafetensorsHeader
  buffer: mmap.mmap

  @staticmethod
  def open(header: SafetensorsHeader, populate: bool = True) -> MappedFile:
    """Maps `header.path`; with populate the kernel faults the pages in now (page-cache reads
    or disk readahead), so later views are read without page faults."""
    with open(header.path, "rb") as f:
      if header.file_size == 0:
        raise ValueError(f"{header.path}: empty file")
      flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
      buffer = mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
    if populate and not getattr(mmap, "MAP_POPULATE", 0) and hasattr(buffer, "madvise"):
      buffer.madvise(mmap.MADV_WILLNEED)
    return MappedFile(header, buffer)

  def view(self, info: TensorInfo) -> np.ndarray:
    """The tensor's bytes as a read-only numpy array [*info.shape] (no copy)."""
    count = info.nbytes // info.dtype.itemsize
    if count == 0:
      return np.empty(info.shape, info.dtype)
    flat = np.frombuffer(self.buffer, dtype=info.dtype, count=count, offset=info.begin)
    return flat.reshape(info.shape)


def load_file(path: Path) -> dict[str, np.ndarray]:
  """Every tensor of `path`, copied into its own array (as safetensors.numpy.load_file)."""
  header = read_header(path)
  mapped = MappedFile.open(header, populate=False)
  return {name: np.array(mapped.view(info)) for name, info in header.tensors.items()}
