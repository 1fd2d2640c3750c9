"""The mmap safetensors reader: bit-identical to safetensors' own numpy reader, zero-copy views,
and header errors that name the file."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from jaxserve.models.safetensors_reader import MappedFile, load_file, read_header


def _tensors() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  base = rng.standard_normal((7, 5)).astype(np.float32) * 100
  return {
    "f32": base,
    "f32_transposed": np.ascontiguousarray(base.T),
    "bf16": base.astype(ml_dtypes.bfloat16),
    "f16": base.astype(np.float16),
    "bf16_vector": rng.standard_normal(3).astype(ml_dtypes.bfloat16),  # odd byte offsets follow
    "f16_3d": rng.standard_normal((2, 3, 4)).astype(np.float16),
    "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
    "u8": np.arange(5, dtype=np.uint8),
    "scalar": np.array(1.5, np.float32),
    "empty": np.zeros((0, 4), np.float32),
  }


def test_bit_identical_to_safetensors_numpy(tmp_path):
  path = tmp_path / "m.safetensors"
  safetensors.numpy.save_file(_tensors(), path, metadata={"format": "pt"})
  reference = safetensors.numpy.load_file(path)
  ours = load_file(path)
  assert ours.keys() == reference.keys()
  for name, expected in reference.items():
    assert ours[name].dtype == expected.dtype and ours[name].shape == expected.shape, name
    assert ours[name].tobytes() == expected.tobytes(), name
  assert read_header(path).metadata == {"format": "pt"}


def test_views_are_zero_copy_and_read_only(tmp_path):
  path = tmp_path / "m.safetensors"
  safetensors.numpy.save_file(_tensors(), path)
  header = read_header(path)
  mapped = MappedFile.open(header)
  view = mapped.view(header.tensors["bf16"])
  assert not view.flags.writeable and not view.flags.owndata
  np.testing.assert_array_equal(view.T, _tensors()["bf16"].T)  # transposed views read the same
  assert header.tensors["bf16"].nbytes == 7 * 5 * 2


def _write_raw(path, header: dict, data: bytes = b"") -> None:
  blob = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


@pytest.mark.parametrize(
  "header, data, message",
  [
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "needs 8"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "past the end"),
    ({"t": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "unsupported dtype"),
    ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "invalid shape"),
    ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4, "data_offsets"),
  ],
)
def test_bad_headers_name_file_and_tensor(tmp_path, header, data, message):
  path = tmp_path / "bad.safetensors"
  _write_raw(path, header, data)
  with pytest.raises(ValueError, match=rf"bad\.safetensors: tensor 't'.*{message}"):
    read_header(path)


def test_truncated_and_garbage_files(tmp_path):
  path = tmp_path / "bad.safetensors"
  path.write_bytes(b"\x01\x02")
  with pytest.raises(ValueError, match="bad.safetensors: not a safetensors file"):
    read_header(path)
  path.write_bytes(struct.pack("<Q", 1000) + b"{}")
  with pytest.raises(ValueError, match="header length 1000"):
    read_header(path)
  path.write_bytes(struct.pack("<Q", 3) + b"{x}")
  with pytest.raises(ValueError, match="invalid safetensors header JSON"):
    read_header(path)
