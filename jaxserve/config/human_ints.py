"""vLLM's human-readable integers for token counts on the command line (`--max-model-len 32K`,
`--max-num-batched-tokens 8k`): the one parser of them.

A lowercase suffix is decimal (k 10**3, m 10**6, g 10**9, t 10**12) and may follow a decimal
number (`25.6k` is 25,600); an uppercase one is binary (K 2**10, M 2**20, G 2**30, T 2**40) and
takes a whole number only (`32K` is 32,768, `1M` 1,048,576); a plain integer is itself. This is
vLLM's rule (its `human_readable_int`), so a vLLM command line means the same number here.
Anything else is an argparse.ArgumentTypeError naming the value, which argparse reports with the
flag's name.
"""

from __future__ import annotations

import argparse
import re

DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_FORM = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")


def human_int(text: str) -> int:
  """The integer `text` writes, e.g. human_int("1k") == 1000, human_int("32K") == 32768."""
  match = _FORM.fullmatch(text.strip())
  if match is None:
    raise argparse.ArgumentTypeError(
      f"{text!r} is not an integer (suffixes: k/m/g/t decimal, K/M/G/T binary, e.g. 32K)"
    )
  number, suffix = match.groups()
  if suffix in DECIMAL:
    return int(float(number) * DECIMAL[suffix])
  if "." in number:
    raise argparse.ArgumentTypeError(
      f"{text!r}: a decimal number takes a decimal suffix (k/m/g/t, e.g. 25.6k), not {suffix!r}"
      if suffix
      else f"{text!r} is not an integer"
    )
  return int(number) * BINARY.get(suffix, 1)
