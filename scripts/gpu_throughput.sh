#!/usr/bin/env bash
# Throughput on a GPU for a Llama-3.2-1B-shaped random bfloat16 model: bench_offline (per-bucket
# device times) and `jaxserve bench throughput` against transformers generate in one run.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
MODEL=/tmp/llama1b
ENGINE=(--set scheduler.max_num_seqs=256 --set scheduler.max_num_batched_tokens=${BUDGET:-4096}
        --set "scheduler.seq_buckets=[64,256]" --set "scheduler.token_buckets=${TOKEN_BUCKETS:-[256,1024,4096]}"
        --max-model-len 640 --log-level WARNING)
[ -f $MODEL/config.json ] || python3 -c "from jaxserve.bench.random_checkpoint import build_random_model as b; b('llama-3.2-1b', '$MODEL')"
python3 -m jaxserve.bench.bench_offline --model $MODEL --num-prompts 512 --input-len 512 --output-len 128 \
  "${ENGINE[@]}" --out "$OUT/bench_offline_1b.json" 2>&1 | grep -v "it/s]\|bucket/s]"
python3 -m jaxserve.cli bench throughput --model $MODEL --hf-baseline --hf-batch-size 128 \
  --num-prompts 512 --input-len 512 --output-len 128 "${ENGINE[@]}" \
  --out "$OUT/bench_throughput_1b.json" 2>&1 | grep -v "it/s]\|bucket/s]\|req/s]"
