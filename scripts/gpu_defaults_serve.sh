#!/usr/bin/env bash
# Device-aware defaults over HTTP on one GPU (issue 29): `jaxserve serve MODEL` with no config
# beside `--config configs/h100.yaml`, for the 8B- and 1B-shaped random checkpoints, each
# measured by scripts/gpu_defaults_serve.py (rate inf 1000 x 256/256 by `jaxserve bench serve`,
# the independent plain client, bench serve again; rate $RATE for $RATE_S s at 1024/128). RUNS
# picks the steps (NAME = {noconfig,config}{8b,1b}; ck8b / ck1b build the checkpoints if absent),
# table prints the comparison. capN_8b / capN_1b: no config with
# scheduler.mixed_step_prefill_tokens=N (e.g. cap384_8b; --quick: one burst and the rate, no
# plain client). ROUNDS=N: N (plain client, bench serve) pairs after the first burst; PLAIN=N:
# the plain client's processes. e.g. RUNS="ck8b noconfig8b config8b cap384_8b table".
# budget8b (issue 56): in one call, `jaxserve serve` with no config from an empty compilation
# cache (its step programs and compile time), the burst 1000 x 256/256 from 4 client processes
# and rate $RATE for $RATE_S s (1024/128, range ratio 0.5), then LLM.generate with no config
# (bench_offline, its own defaults) on the same burst; prints one table (short_table.md):
# RUNS="ck8b budget8b" RATE_S=20 bash scripts/gpu_defaults_serve.sh
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # $OUT, $LOGS, the carried wheels, step()
RATE=${RATE:-16}; RATE_S=${RATE_S:-30}
API=${API_SERVERS:-$(python3 -c "from jaxserve.core.supervisor import default_api_server_count as d; print(d())")}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
run() { local name=$1 model=$2; shift 2
  TAIL=30 step "$name" python3 scripts/gpu_defaults_serve.py --name "$name" --model "$model" \
    --out "$OUT" --rate "$RATE" --rate-seconds "$RATE_S" --api-servers "$API" ${QUICK:-} \
    --rounds ${ROUNDS:-1} --plain-processes ${PLAIN:-4} \
    -- --max-model-len ${MAX_MODEL_LEN:-2048} "$@"; }  # the API server count: the default
for s in ${RUNS:-ck8b noconfig8b config8b table}; do case $s in
  ck8b) [ -f /tmp/llama8b/config.json ] || step ck8b python3 -m jaxserve.bench.random_checkpoint llama-3.1-8b /tmp/llama8b ;;
  ck1b) [ -f /tmp/llama1b/config.json ] || step ck1b python3 -m jaxserve.bench.random_checkpoint llama-3.2-1b /tmp/llama1b ;;
  noconfig8b) run noconfig8b /tmp/llama8b ;;
  config8b) run config8b /tmp/llama8b --config configs/h100.yaml ;;
  noconfig1b) run noconfig1b /tmp/llama1b ;;
  config1b) run config1b /tmp/llama1b --config configs/h100.yaml ;;
  cap*_8b) n=${s#cap}; QUICK=--quick run "$s" /tmp/llama8b --set scheduler.mixed_step_prefill_tokens=${n%_8b} ;;
  cap*_1b) n=${s#cap}; QUICK=--quick run "$s" /tmp/llama1b --set scheduler.mixed_step_prefill_tokens=${n%_1b} ;;
  budget8b) TAIL=40 step budget8b python3 -m jaxserve.bench.serve_vs_offline --model /tmp/llama8b \
      --max-model-len ${MAX_MODEL_LEN:-2048} --modes multi-process --client-processes 4 \
      --offline-defaults offline --offline-last --sweep-rates "$RATE" --sweep-seconds "$RATE_S" \
      --single-stream-prompts 0 --short-table --out-dir "$OUT/budget8b"
    cat "$OUT/budget8b/short_table.md" 2>/dev/null | tee -a "$OUT/summary.txt" ;;
  table) python3 scripts/gpu_defaults_serve.py --table "$OUT" | tee -a "$OUT/summary.txt" ;;
  *) echo "unknown step $s" | tee -a "$OUT/summary.txt" ;;
esac; done
