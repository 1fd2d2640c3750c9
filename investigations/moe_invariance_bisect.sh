#!/usr/bin/env bash
# Where tp_invariant_reductions stops being bitwise for a mixture of experts at real widths: a
# Qwen3-30B-A3B-shaped random checkpoint cut to $LAYERS layers, offline 128 x 256/256 greedy (the
# ep steps of scripts/gpu_moe.sh), one device against two, tensor and expert parallel, with the
# Pallas attention and with XLA's, with decode bursts and without. Prints, per variant, how many
# requests of the two-device run produced the one-device run's tokens. Needs 2 GPUs.
set -uo pipefail
# VARIANTS: pallas, xla (attention), pallas_nobursts (decode steps one at a time), llama (a
# Llama-3.1-8B-shaped checkpoint cut the same way, Pallas attention: the dense control), llama_kv4
# (the same with 4 kv heads: Qwen3-30B-A3B's 8 query heads per kv head), logprobs (the MoE
# checkpoint's top-5 logprobs of the prefill and of the decode steps, one device against two:
# investigations/check_moe_prefill_logprobs.py; 16 prompts of 256 tokens, 64 generated, the
# offline defaults), logprobs128 (the same with the bisection's workload and scheduler: 128 x
# 256/256, 128 sequences, 4,096 tokens a step); EPS: the enable_expert_parallel values to try.
OUT=${OUT:-out}; mkdir -p "$OUT"; LAYERS=${LAYERS:-4}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
cut() {  # cut SHAPE DIR [FIELDS]: SHAPE's random checkpoint with $LAYERS layers (and FIELDS,
  # ModelConfig.replace keywords) in DIR, unless there
  [ -f "$2/config.json" ] || python3 -c "
from jaxserve.bench.random_checkpoint import build_random_checkpoint
from jaxserve.models.named_shapes import named_model_config
build_random_checkpoint(named_model_config('$1').replace(num_layers=$LAYERS, ${3:-}), '$2')"; }
EP=(--num-prompts 128 --input-len 256 --output-len 256 --max-model-len 512 --max-num-seqs 128
  --max-num-batched-tokens 4096 --set "scheduler.seq_buckets=[128]"
  --set "scheduler.token_buckets=[128,4096]" --set tp_invariant_reductions=true
  --set cache.memory_bytes=$((8 << 30)) --no-stream --log-level WARNING)
run() { python3 -m jaxserve.bench.bench_offline --model "$CK" --config configs/h100.yaml "${EP[@]}" \
  "$@" > /tmp/bisect.log 2>&1 || { tail -5 /tmp/bisect.log; return 1; }; }
logprobs() {  # logprobs EP [FLAGS]: the prefill's and decode's top-5 logprobs, one device
  # against two
  local ep=$1; shift
  for tp in 1 2; do
    python3 -m investigations.check_moe_prefill_logprobs run --model "$CK" "$@" \
      --out "$OUT/logprobs_ep${ep}_tp$tp.npz" --set tensor_parallel_size=$tp \
      --set enable_expert_parallel=$ep --set tp_invariant_reductions=true \
      --set cache.memory_bytes=$((8 << 30)) --set max_model_len=512 > /tmp/bisect.log 2>&1 \
      || { tail -5 /tmp/bisect.log; return 1; }
  done
  echo "logprobs expert_parallel=$ep, $LAYERS layers, $*:"
  python3 -m investigations.check_moe_prefill_logprobs compare "$OUT/logprobs_ep${ep}_tp1.npz" \
    "$OUT/logprobs_ep${ep}_tp2.npz"; }
for variant in ${VARIANTS:-pallas xla pallas_nobursts}; do
  extra=(); CK=/dev/shm/moe_${LAYERS}l; eps=${EPS:-false true}; case $variant in
    xla) extra=(--set attention_backend=xla) ;;
    pallas_nobursts) extra=(--set scheduler.num_scheduler_steps=1) ;;
    llama) CK=/dev/shm/llama_${LAYERS}l; eps=false ;;
    llama_kv4) CK=/dev/shm/llama_kv4_${LAYERS}l; eps=false ;;
  esac
  case $variant in
    llama) cut llama-3.1-8b "$CK" ;;
    llama_kv4) cut llama-3.1-8b "$CK" num_kv_heads=4 ;;
    *) cut qwen3-30b-a3b "$CK" ;;
  esac
  if [ "$variant" = logprobs ]; then for ep in $eps; do logprobs "$ep"; done; continue; fi
  if [ "$variant" = logprobs128 ]; then
    for ep in $eps; do
      logprobs "$ep" --prompts 128 --output-len 256 --set scheduler.max_num_seqs=128 \
        --set scheduler.max_num_batched_tokens=4096 --set "scheduler.seq_buckets=[128]" \
        --set "scheduler.token_buckets=[128,4096]"
    done
    continue
  fi
  for ep in $eps; do
    for tp in 1 2; do
      run "${extra[@]}" --set tensor_parallel_size=$tp --set enable_expert_parallel=$ep \
        --out "$OUT/${variant}_ep${ep}_tp$tp.json"
    done
    python3 -c "
import json, sys
a, b = (json.load(open(f'$OUT/${variant}_ep${ep}_tp{t}.json'))['token_digests'] for t in (1, 2))
print('$variant expert_parallel=$ep: tp2 tokens as tp1 for', sum(x == y for x, y in zip(a, b)), 'of', len(a))"
  done
done
