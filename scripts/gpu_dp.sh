#!/usr/bin/env bash
# Data parallelism on one host (issue 31, item 1) on a 2-GPU machine, steps chosen by STEPS (each
# fits one 10-minute device call; the serving steps first build the checkpoint if $MODEL has
# none, about 2-3 min, so run `ck` with the first of them on a fresh machine):
#   ck     the Llama-3.1-8B-shaped random bf16 checkpoint in $MODEL (16 GB; skipped if present)
#   one    one GPU (CUDA_VISIBLE_DEVICES=0): `jaxserve serve` (--warmup full), $N x 256/256 at
#          rate inf and $RATE req/s for $RATE_S s (same shape), TTFT / TPOT p50/p99, and
#          $GREEDY greedy requests' tokens (scripts/gpu_dp_run.py); about 4-6 min
#   dp2    the same with --data-parallel-size 2 (an engine core per GPU, the API servers
#          routing by load and prefix affinity), plus the requests each core served; 4-6 min
#   tp2    the same with --tensor-parallel-size 2 (one engine over both GPUs); 4-6 min
#   table  the short table (scripts/gpu_dp_table.py): dp2 / one GPU at rate inf against the
#          1.9x target, dp2 against tp2 at rate inf and $RATE, the greedy tokens of dp2 and
#          tp2 against one GPU's; always run last
# API_SERVERS: the servers' API server processes (default: jaxserve's, one per 4 CPU cores, at
# most 4); CLIENTS: the load generator's processes (4); 8 and 8 kept up with dp=2's 27k tok/s,
# 4 and 4 did not (docs/PERFORMANCE.md). SMI=1 samples each GPU's utilization and the processes
# on it (nvidia-smi, every 2 s) during each serving step into $OUT/NAME_smi.csv and
# $OUT/NAME_apps.csv; LOG_LEVEL the server's.
# e.g. STEPS="ck one", then STEPS=dp2, then STEPS="tp2" (table follows each). JSON results in
# $OUT, logs in $LOGS. MODEL=DIR SHAPE=none serves a checkpoint you have. The wheels jaxserve needs beyond the device image are carried in .whl/.
# CPU check (tiny-random, two host devices): tests/bench/test_gpu_dp_script.py.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # $OUT, $LOGS, the carried wheels, step()
MODEL=${MODEL:-/tmp/llama8b}; SHAPE=${SHAPE:-llama-3.1-8b}; CONFIG=${CONFIG:-configs/h100.yaml}
N=${N:-1000}; RATE=${RATE:-16}; RATE_S=${RATE_S:-30}; GREEDY=${GREEDY:-4}
API=${API_SERVERS:-$(python3 -c "from jaxserve.core.supervisor import default_api_server_count as d; print(d())")}
ENGINE=(--config "$CONFIG" --max-model-len ${MAX_MODEL_LEN:-2048} --api-server-count "$API" ${SERVE_FLAGS:-})
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
checkpoint() {  # the random checkpoint, unless $MODEL has one (SHAPE=none: $MODEL as given)
  [ "$SHAPE" = none ] && return
  [ -f "$MODEL/config.json" ] || step ck python3 -m jaxserve.bench.random_checkpoint "$SHAPE" "$MODEL"
  du -sh "$MODEL" | tee -a "$OUT/summary.txt"; }
sample() {  # sample NAME: nvidia-smi samples in the background (SMI=1); their pids in SAMPLERS
  SAMPLERS=(); [ "${SMI:-0}" = 1 ] || return
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 2 \
    > "$OUT/$1_smi.csv" 2>&1 & SAMPLERS+=($!)
  nvidia-smi --query-compute-apps=timestamp,pid,gpu_uuid,used_memory --format=csv -l 5 \
    > "$OUT/$1_apps.csv" 2>&1 & SAMPLERS+=($!)
  nvidia-smi -L > "$OUT/$1_gpus.txt" 2>&1; }
serve() { local name=$1; shift  # serve NAME [ENV=VALUE...] -- FLAGS: one configuration
  checkpoint; sample "$name"
  TAIL=40 step "$name" env "$@" python3 scripts/gpu_dp_run.py --name "$name" --model "$MODEL" \
    --out "$OUT" --num-prompts "$N" --rates "inf,$RATE" --rate-seconds "$RATE_S" \
    --greedy-prompts "$GREEDY" --api-servers "$API" --client-processes "${CLIENTS:-4}" --log-level "${LOG_LEVEL:-WARNING}" ${RUN_FLAGS:-} -- "${ENGINE[@]}" ${FLAGS:-}
  [ ${#SAMPLERS[@]} = 0 ] || kill "${SAMPLERS[@]}" 2>/dev/null; }
for s in ${STEPS:-ck one dp2 tp2} table; do case $s in
  ck) checkpoint ;;
  one) serve one CUDA_VISIBLE_DEVICES=${ONE_GPU:-0} ;;
  dp2) FLAGS="--data-parallel-size 2" serve dp2 ;;
  tp2) FLAGS="--tensor-parallel-size 2" serve tp2 ;;
  table) python3 scripts/gpu_dp_table.py "$OUT" | tee -a "$OUT/summary.txt" ;;
  *) echo "unknown step $s" | tee -a "$OUT/summary.txt" ;;
esac; done
