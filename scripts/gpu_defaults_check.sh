#!/usr/bin/env bash
# Device-aware defaults on one GPU (issue 29): the offline benchmark of the 8B-shaped random
# checkpoint with no config (the defaults jaxserve/config/device_defaults.py picks) beside
# configs/h100-offline.yaml, 2000 x 128/128, alternating. Prints tok/s, the KV pool and the
# "defaults for" log line of each run. Wheels beyond the device image are carried in .whl/.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
[ -f /tmp/llama8b/config.json ] || python3 -c "from jaxserve.bench.random_checkpoint import build_random_llama as b; b('llama-3.1-8b', '/tmp/llama8b')" > /tmp/ck.log 2>&1
for run in noconfig config noconfig2; do
  cfg=""; [ $run = config ] && cfg="--config configs/h100-offline.yaml"
  python3 -m jaxserve.bench.bench_offline $cfg --model /tmp/llama8b --max-model-len 2176 --num-prompts 2000 --input-len 128 --output-len 128 --no-stream --log-level INFO --set compilation_cache_dir=/tmp/xla --out $OUT/off_$run.json > /tmp/$run.log 2>&1 || { echo "$run FAILED"; tail -5 /tmp/$run.log; }
  echo "$run: $(grep -E 'output tokens/s|KV pool' /tmp/$run.log | grep -v it/s | tr '\n' ' ')"
  grep -o "defaults for.*" /tmp/$run.log | cut -c1-400
done
