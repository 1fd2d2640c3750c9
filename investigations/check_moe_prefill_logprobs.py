"""Where one device and two stop agreeing for a mixture of experts under tp_invariant_reductions
(investigations/moe_invariance_bisect.sh: 109/128 greedy requests agree at 4 layers, a dense
Llama 128/128): the same prompts, greedy, with the top-5 prompt logprobs of every position (the
prefill's forward alone) and the top-5 logprobs of each generated token (the decode steps).

`run` writes one configuration's numbers to an .npz; `compare` reads two and prints, for the
prompt positions and for the decode steps apart: how many positions have another top-1 token,
how many differ in any top-5 value, and whether the differences of a position are one shift
for all five (only the log-softmax's normalizer differs: the vocabulary's sum over two shards
in another order; the logits are the same) or not (the logits differ: the forward does).

    python -m investigations.check_moe_prefill_logprobs run --model CK --out tp1.npz \\
        --set tensor_parallel_size=1 --set tp_invariant_reductions=true
    python -m investigations.check_moe_prefill_logprobs compare tp1.npz tp2.npz
"""

from __future__ import annotations

import argparse

import numpy as np

TOP = 5


def run(args: argparse.Namespace) -> None:
  from jaxserve.api.sampling_params import SamplingParams
  from jaxserve.config.loader import load_config
  from jaxserve.entrypoints.llm import LLM

  config = load_config(None if args.config == "none" else args.config, args.set)
  llm = LLM(args.model, config=config, show_progress=False)
  rng = np.random.default_rng(0)
  vocab = llm.engine.vocab_size
  prompts = [rng.integers(100, vocab - 100, args.input_len).tolist() for _ in range(args.prompts)]
  params = SamplingParams(
    temperature=0.0,
    max_tokens=args.output_len,
    ignore_eos=True,
    logprobs=TOP,
    prompt_logprobs=TOP,
  )
  results = llm.generate(prompts, params, use_tqdm=False)
  prompt_top = [_tops(r.prompt_logprobs[1:]) for r in results]  # position 0 has none
  decode_top = [_tops(r.outputs[0].logprobs) for r in results]
  np.savez(
    args.out,
    prompt_ids=np.array([p[0] for p in prompt_top]),
    prompt_values=np.array([p[1] for p in prompt_top]),
    decode_ids=np.array([d[0] for d in decode_top]),
    decode_values=np.array([d[1] for d in decode_top]),
    tokens=np.array([r.outputs[0].token_ids for r in results]),
  )


def _tops(logprobs) -> tuple[list[list[int]], list[list[float]]]:
  """Each position's top-TOP ids and values, in rank order."""
  ids, values = [], []
  for position in logprobs:
    top = sorted(position.top, key=lambda item: -item[1])[:TOP]
    ids.append([token for token, _ in top])
    values.append([value for _, value in top])
  return ids, values


def _describe(name: str, ids_a, values_a, ids_b, values_b) -> str:
  top1 = ids_a[..., 0] != ids_b[..., 0]
  same_ids = np.all(ids_a == ids_b, axis=-1)
  differ = np.any(values_a != values_b, axis=-1) & same_ids
  delta = values_a - values_b
  shift = differ & np.all(np.abs(delta - delta[..., :1]) == 0, axis=-1)
  first = [int(np.argmax(row)) if row.any() else -1 for row in (differ | ~same_ids)]
  return (
    f"{name}: {top1.sum()} of {top1.size} positions with another top-1 token; of the positions "
    f"with the same top-{TOP} ids, {differ.sum()} differ in value, {shift.sum()} of them by one "
    f"shift (the normalizer only); max |diff| {np.abs(delta).max():.3g}; first differing "
    f"position per request: {first}"
  )


def compare(args: argparse.Namespace) -> None:
  a, b = np.load(args.a), np.load(args.b)
  for part in ("prompt", "decode"):
    ids, values = f"{part}_ids", f"{part}_values"
    print(_describe(part, a[ids], a[values], b[ids], b[values]))
  same = np.all(a["tokens"] == b["tokens"], axis=-1)
  print(f"generated tokens: {same.sum()} of {same.size} requests the same")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  one = sub.add_parser("run")
  one.add_argument("--model", required=True)
  one.add_argument("--out", required=True)
  one.add_argument("--config", default="configs/h100.yaml", help="none: the defaults")
  one.add_argument("--set", action="append", default=[], help="a dotted config override")
  one.add_argument("--prompts", type=int, default=16)
  one.add_argument("--input-len", type=int, default=256)
  one.add_argument("--output-len", type=int, default=64)
  two = sub.add_parser("compare")
  two.add_argument("a")
  two.add_argument("b")
  args = parser.parse_args()
  run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
  main()
