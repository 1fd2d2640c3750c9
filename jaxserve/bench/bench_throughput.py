"""`jaxserve bench throughput`: offline throughput through LLM.generate, optionally against
transformers `generate` on the same prompts.

Workload: `num_prompts` random token-id prompts of exactly `input_len` tokens, greedy,
`output_len` tokens each with ignore_eos, all submitted at once; engine warmup (compiling every
bucket) happens when the LLM is built, outside the timed region. The baseline (hf_baseline.py)
runs first, in its own process, so the two never share GPU memory. For tiny-random the baseline
uses an exported transformers copy (export_hf.py); --random-model builds a random-weight
checkpoint of a named model shape (random_checkpoint.py). Without --max-model-len the engine's
max_model_len is input_len + output_len rounded up to a page.
"""

from __future__ import annotations

import math
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxserve.config import EngineConfig
from jaxserve.models.tiny_random import TINY_RANDOM_NAME
from jaxserve.tools.json_file import write_json


def random_prompts(num_prompts: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return rng.integers(0, vocab_size, size=(num_prompts, input_len)).tolist()


def prompt_vocab_size(config: EngineConfig) -> int:
  """Token ids valid for both the model and its tokenizer."""
  from jaxserve.models.registry import load_model_tokenizer, model_path
  from jaxserve.tools.kv_plan import model_config_for

  tokenizer = load_model_tokenizer(model_path(config))
  return min(model_config_for(config).vocab_size, tokenizer.vocab_size)


def run_jaxserve(config: EngineConfig, prompts: list[list[int]], output_len: int) -> dict:
  import jax

  from jaxserve.api.sampling_params import SamplingParams
  from jaxserve.entrypoints.llm import LLM

  if config.warmup == "auto":  # timings without compilation: every program compiled up front
    config = config.replace(warmup="full")
  llm = LLM(config.model, config=config)
  params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
  compiled_before = llm.engine.ledger.num_compilations
  start = time.perf_counter()
  results = llm.generate(prompts, params)
  elapsed = time.perf_counter() - start
  lengths = [len(r.outputs[0].token_ids) for r in results]
  num_output = sum(lengths)
  timings = llm.engine.timings
  return {
    "engine": "jaxserve",
    "backend": jax.default_backend(),
    "device": str(jax.devices()[0].device_kind),
    "jax": jax.__version__,
    "elapsed_s": elapsed,
    "output_tokens": num_output,
    "all_outputs_full_length": all(n == output_len for n in lengths),
    "output_tokens_per_s": num_output / elapsed,
    "total_tokens_per_s": (num_output + sum(map(len, prompts))) / elapsed,
    "steps": timings.num_steps,
    "host_ms_per_step": 1e3 * timings.host_seconds / max(timings.num_steps, 1),
    "device_ms_per_step": 1e3 * timings.device_seconds / max(timings.num_steps, 1),
    "compilations_after_warmup": llm.engine.ledger.num_compilations - compiled_before,
    "warmup_s": llm.engine.warmup_seconds,
  }


def _prepare_model(config: EngineConfig, args, tmp: Path) -> tuple[EngineConfig, str | None]:
  """The engine config to run and the transformers checkpoint for the baseline (if any)."""
  if args.random_model:
    from jaxserve.bench.random_checkpoint import build_random_model

    out_dir = Path(args.random_model_dir) if args.random_model_dir else tmp / args.random_model
    print(f"building random-weight {args.random_model} checkpoint in {out_dir}")
    config = config.replace(model=str(build_random_model(args.random_model, out_dir, args.seed)))
  if config.max_model_len is None:
    page = config.cache.page_size
    config = config.replace(
      max_model_len=page * math.ceil((args.input_len + args.output_len) / page)
    )
  if not args.hf_baseline:
    return config, None
  if config.model == TINY_RANDOM_NAME:
    from jaxserve.tools.export_hf import export_tiny_random_hf

    return config, str(export_tiny_random_hf(tmp / "tiny-random-hf"))
  return config, config.model


def main(args) -> int:
  from jaxserve.config.cli_args import engine_config_from_args
  from jaxserve.tools.kv_plan import model_config_for

  config = engine_config_from_args(args)
  with tempfile.TemporaryDirectory(prefix="jaxserve-bench-") as tmp:
    config, hf_dir = _prepare_model(config, args, Path(tmp))
    prompts = random_prompts(args.num_prompts, args.input_len, prompt_vocab_size(config), args.seed)
    result = {
      "model": config.model,
      "quantization": model_config_for(config).quantization,
      "kv_cache_dtype": config.cache.kv_cache_dtype,
      "random_model": args.random_model,
      "num_prompts": args.num_prompts,
      "input_len": args.input_len,
      "output_len": args.output_len,
      "python": platform.python_version(),
    }
    if hf_dir is not None:
      from jaxserve.bench.hf_baseline import run_in_subprocess

      dtype = model_config_for(config).dtype
      result["transformers"] = run_in_subprocess(
        hf_dir, prompts, args.output_len, args.hf_batch_size, args.hf_device, dtype
      )
    result["jaxserve"] = run_jaxserve(config, prompts, args.output_len)
  if "transformers" in result:
    result["speedup_vs_transformers"] = (
      result["jaxserve"]["output_tokens_per_s"] / result["transformers"]["output_tokens_per_s"]
    )
  print(format_result(result))
  if args.out:
    print(f"wrote {write_json(args.out, result)}")
  return 0


def format_result(result: dict) -> str:
  engines = [result[k] for k in ("jaxserve", "transformers") if k in result]
  lines = [
    f"model {result['model']}: {result['num_prompts']} prompts, {result['input_len']} in / "
    f"{result['output_len']} out (greedy, ignore_eos; weights {result['quantization']}, KV "
    f"{result['kv_cache_dtype']})",
    f"{'engine':<14}{'device':<22}{'elapsed s':>11}{'output tok/s':>15}{'total tok/s':>14}",
  ]
  for e in engines:
    lines.append(
      f"{e['engine']:<14}{e['device'][:21]:<22}{e['elapsed_s']:>11.2f}"
      f"{e['output_tokens_per_s']:>15.1f}{e['total_tokens_per_s']:>14.1f}"
    )
  if "speedup_vs_transformers" in result:
    lines.append(
      f"jaxserve / transformers output throughput: "
      f"{result['speedup_vs_transformers']:.2f}x "
      f"(transformers batch {result['transformers']['batch_size']})"
    )
  return "\n".join(lines)
