"""PNG validity checks shared by the tools tests."""

from __future__ import annotations

from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_valid_png(path: Path) -> None:
  import matplotlib.image

  path = Path(path)
  assert path.is_file(), path
  assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path}: not a PNG"
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, image.shape
  assert image.std() > 0, f"{path}: blank image"
