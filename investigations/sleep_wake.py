"""Sleep level 1 and wake on a real model (engine/sleep_mode.py, device/sleep_mode.py): device
memory before sleep, asleep and after wake (`memory_stats()["bytes_in_use"]` of the first device;
on a CPU, which reports none, the bytes of jax.live_arrays()), the seconds sleep and wake take, the
greedy tokens of a few prompts before and after, and the compilations after wake (none expected).
Beside JAX's count, the driver's (nvidia-smi's memory.used of GPU 0, where there is one): the JAX
GPU client pre-allocates its arena (device/client_memory.py), so what sleep frees returns to that
arena, not to the driver, and the driver's number is expected to stay.

    python -m investigations.sleep_wake --model /tmp/llama8b --out sleep_wake.json

prints a short table and writes it as JSON to --out.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time

import jax
import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.entrypoints.llm import LLM
from jaxserve.runtime.memory_stats import memory_stats
from jaxserve.tools.json_file import write_json

GIB = 1 << 30


def device_bytes() -> tuple[int, str]:
  """Bytes in use on the first device, and where the number comes from."""
  stats = memory_stats(jax.devices()[0])
  if stats and "bytes_in_use" in stats:
    return int(stats["bytes_in_use"]), "memory_stats"
  return sum(a.nbytes for a in jax.live_arrays()), "live_arrays"


def driver_bytes() -> int | None:
  """GPU 0's memory in use as the driver sees it (nvidia-smi), None without one."""
  if shutil.which("nvidia-smi") is None:
    return None
  query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
  out = subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()
  return int(out) << 20 if out.isdigit() else None


def prompts(vocab_size: int, count: int, length: int) -> list[list[int]]:
  rng = np.random.default_rng(0)
  return [rng.integers(10, vocab_size - 1, size=length).tolist() for _ in range(count)]


def greedy(llm: LLM, batch: list[list[int]], max_tokens: int) -> list[list[int]]:
  params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
  return [list(r.outputs[0].token_ids) for r in llm.generate(batch, params, use_tqdm=False)]


def measure(llm: LLM, num_prompts: int, prompt_len: int, max_tokens: int) -> dict:
  batch = prompts(llm.engine.vocab_size, num_prompts, prompt_len)
  before = greedy(llm, batch, max_tokens)  # compiles what the batch uses (lazy warmup)
  compiled = llm.engine.ledger.num_compilations
  awake, source = device_bytes()
  driver = [driver_bytes()]
  start = time.perf_counter()
  llm.sleep(level=1)
  sleep_s = time.perf_counter() - start
  asleep, _ = device_bytes()
  driver.append(driver_bytes())
  start = time.perf_counter()
  llm.wake_up()
  wake_s = time.perf_counter() - start
  woken, _ = device_bytes()
  driver.append(driver_bytes())
  after = greedy(llm, batch, max_tokens)
  return {
    "bytes_source": source,
    "bytes_awake": awake,
    "bytes_asleep": asleep,
    "bytes_woken": woken,
    "driver_bytes_awake_asleep_woken": driver,
    "sleep_s": sleep_s,
    "wake_s": wake_s,
    "same_greedy_tokens": after == before,
    "compilations_after_wake": llm.engine.ledger.num_compilations - compiled,
    "num_prompts": num_prompts,
    "max_tokens": max_tokens,
    "tokens_before": before,
    "tokens_after": after,
  }


def driver_row(values: list[int | None]) -> str:
  return " / ".join("n/a" if v is None else f"{v / GIB:.2f}" for v in values) + " GiB"


def table(result: dict) -> str:
  rows = [
    ("device bytes awake", f"{result['bytes_awake'] / GIB:.2f} GiB ({result['bytes_source']})"),
    ("device bytes asleep (level 1)", f"{result['bytes_asleep'] / GIB:.2f} GiB"),
    ("device bytes after wake", f"{result['bytes_woken'] / GIB:.2f} GiB"),
    ("driver bytes awake/asleep/woken", driver_row(result["driver_bytes_awake_asleep_woken"])),
    ("sleep", f"{result['sleep_s']:.3f} s"),
    ("wake", f"{result['wake_s']:.3f} s"),
    ("same greedy tokens after wake", str(result["same_greedy_tokens"])),
    ("compilations after wake", str(result["compilations_after_wake"])),
  ]
  return "\n".join(f"{name:<32} {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="tiny-random")
  parser.add_argument("--max-model-len", type=int, default=2048)
  parser.add_argument("--num-prompts", type=int, default=4)
  parser.add_argument("--prompt-len", type=int, default=64)
  parser.add_argument("--max-tokens", type=int, default=32)
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  llm = LLM(
    args.model, enable_sleep_mode=True, max_model_len=args.max_model_len, show_progress=False
  )
  result = measure(llm, args.num_prompts, args.prompt_len, args.max_tokens)
  print(table(result))
  if args.out:
    write_json(args.out, result)
  return result


if __name__ == "__main__":
  main()
