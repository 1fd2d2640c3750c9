"""The transformers baseline of `bench throughput`: the same prompts through `model.generate`.

Prompts run in static batches of `batch_size`, left-padded with an attention mask, greedy, with
min_new_tokens = max_new_tokens = output_len so no sequence stops early. One short generate call
warms up (CUDA kernels, caches) outside the timed region. `run_in_subprocess` runs it in a fresh
Python process, so that the baseline and JAX never hold GPU memory at the same time (JAX reserves
most of the GPU once it starts) and everything torch held is released when it exits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

_TORCH_DTYPES = ("float32", "bfloat16")


def hf_generate_throughput(
  model_dir: str,
  prompts: Sequence[Sequence[int]],
  output_len: int,
  batch_size: int,
  device: str | None = None,
  dtype: str = "float32",
) -> dict:
  import torch
  import transformers

  if dtype not in _TORCH_DTYPES:
    raise ValueError(f"dtype: must be one of {_TORCH_DTYPES}, got {dtype!r}")
  device = device or ("cuda" if torch.cuda.is_available() else "cpu")
  model = (
    transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    .to(device)
    .eval()
  )
  pad_id = 0
  _generate(model, [list(prompts[0])[:8]], 2, pad_id, device)  # warmup
  _synchronize(torch, device)
  start = time.perf_counter()
  num_output = 0
  for first in range(0, len(prompts), batch_size):
    batch = [list(p) for p in prompts[first : first + batch_size]]
    num_output += _generate(model, batch, output_len, pad_id, device)
  _synchronize(torch, device)
  elapsed = time.perf_counter() - start
  num_input = sum(len(p) for p in prompts)
  return {
    "engine": "transformers",
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "device": device,
    "dtype": dtype,
    "batch_size": batch_size,
    "elapsed_s": elapsed,
    "output_tokens": num_output,
    "output_tokens_per_s": num_output / elapsed,
    "total_tokens_per_s": (num_output + num_input) / elapsed,
  }


def _generate(model, batch: list[list[int]], output_len: int, pad_id: int, device: str) -> int:
  import torch

  width = max(len(p) for p in batch)
  input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch], device=device)
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
  with torch.inference_mode():
    out = model.generate(
      input_ids=input_ids,
      attention_mask=mask,
      do_sample=False,
      max_new_tokens=output_len,
      min_new_tokens=output_len,
      pad_token_id=pad_id,
      temperature=None,
      top_p=None,
      top_k=None,
    )
  return int(out.shape[0] * (out.shape[1] - width))


def _synchronize(torch, device: str) -> None:
  if device.startswith("cuda"):
    torch.cuda.synchronize()


def run_in_subprocess(
  model_dir: str,
  prompts: Sequence[Sequence[int]],
  output_len: int,
  batch_size: int,
  device: str | None,
  dtype: str,
) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    job, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
    job.write_text(
      json.dumps(
        {
          "model_dir": model_dir,
          "prompts": [list(p) for p in prompts],
          "output_len": output_len,
          "batch_size": batch_size,
          "device": device,
          "dtype": dtype,
        }
      )
    )
    subprocess.run(
      [sys.executable, "-m", "jaxserve.bench.hf_baseline", str(job), str(result)], check=True
    )
    return json.loads(result.read_text())


def _main(job_path: str, result_path: str) -> None:
  job = json.loads(Path(job_path).read_text())
  Path(result_path).write_text(json.dumps(hf_generate_throughput(**job)))


if __name__ == "__main__":
  _main(*sys.argv[1:3])
