#!/usr/bin/env bash
# A Llama-3.1-70B-shaped bf16 server over four GPUs of one host (issue 31), steps chosen by STEPS:
#   ck70     the random bf16 checkpoint in $MODEL (141 GB; skipped if present; /dev/shm by default)
#   tpot     single stream at tensor parallel $TP (4): 1 prompt of 1024 in / 256 out (bench_offline;
#            an 8-sequence bucket, bursts of 8, as gpu_moe.sh measures one stream), beside the
#            read time of a GPU's share of the weights (bench/active_weights.py / TP) at the
#            card's measured copy bandwidth
#   steps    decode step time at batch 64 and 256 (context 512) and the all-reduces' time per
#            step measured on their own (investigations/bench_tp.py: two per layer)
#   off      offline $N x 256/256 (bench_offline)
#   fp8      the same checkpoint quantized to fp8 as it loads, tensor parallel 2: tpot and off
#   table    the short table of every result in $OUT (scripts/gpu_tp4_table.py); always run last
# Each step loads the model again (1-3 minutes at 141 GB); a call of ck70 + tpot + steps fits the
# 10-minute limit on a warm /dev/shm, off and fp8 each want a call. The wheels jaxserve needs
# beyond the device image are carried in .whl/. CPU check: tests/bench/test_gpu_tp4_script.py.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # $OUT, $LOGS, the carried wheels, step()
export NCCL_NVLS_ENABLE=0
MODEL=${MODEL:-/dev/shm/llama70b}; SHAPE=${SHAPE:-llama-3.1-70b}; CONFIG=${CONFIG:-configs/h100.yaml}
TP=${TP:-4}; N=${N:-1000}; BATCHES=${BATCHES:-64,256}
SINGLE=(--max-num-seqs 8 --max-num-batched-tokens 1024 --set "scheduler.seq_buckets=[8]"
  --set "scheduler.token_buckets=[8,1024]" --set scheduler.num_scheduler_steps=8)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
python3 -c "import jax; print('jax', jax.__version__, jax.device_count(), jax.devices()[0].device_kind)" | tee -a "$OUT/summary.txt"
offline() { local name=$1; shift
  step "$name" python3 -m jaxserve.bench.bench_offline --model "$MODEL" --config "$CONFIG" \
    --no-stream --log-level WARNING --out "$OUT/$name.json" "$@"; }
tpot() { local name=$1; shift
  offline "$name" "$@" "${SINGLE[@]}" --num-prompts 1 --input-len 1024 --output-len 256 \
    --max-model-len 2048; }
copy_bandwidth() {
  [ -f "$OUT/copy_bandwidth.json" ] || python3 -c "import json; \
from investigations.kernel_timing import copy_bandwidth as c; \
print(json.dumps({'copy_gb_per_s': c(${COPY_BYTES:-4294967296}, inner=10, reps=5) / 1e9}))" \
    > "$OUT/copy_bandwidth.json" 2> "$LOGS/copy_bandwidth.log"; }
for s in ${STEPS:-ck70 tpot steps} table; do case $s in
  ck70) [ -f "$MODEL/config.json" ] || step ck70 python3 -m jaxserve.bench.random_checkpoint \
      "$SHAPE" "$MODEL"
    du -sh "$MODEL" | tee -a "$OUT/summary.txt" ;;
  tpot) tpot tp4_tpot --set tensor_parallel_size="$TP"
    python3 -m jaxserve.bench.active_weights "$MODEL" > "$OUT/active.json"
    copy_bandwidth ;;
  steps) for b in ${BATCHES//,/ }; do
      step "steps_$b" python3 -m investigations.bench_tp --model "$MODEL" --tp "$TP" --batch "$b" \
        --parity-tokens 4 --out "$OUT/steps_$b.json"
    done ;;
  off) offline tp4_off --set tensor_parallel_size="$TP" --num-prompts "$N" --input-len 256 \
      --output-len 256 --max-model-len 512 ;;
  fp8) tpot fp8_tpot --set tensor_parallel_size=2 --set quantization=fp8
    offline fp8_off --set tensor_parallel_size=2 --set quantization=fp8 --num-prompts "$N" \
      --input-len 256 --output-len 256 --max-model-len 512 ;;
  table) python3 scripts/gpu_tp4_table.py "$OUT" "$TP" | tee -a "$OUT/summary.txt" ;;
  *) echo "unknown step $s" | tee -a "$OUT/summary.txt" ;;
esac; done
