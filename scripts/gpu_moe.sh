#!/usr/bin/env bash
# Mixtures of experts and Gemma 3 on one GPU (issues 27 and 28), steps chosen by STEPS:
#   ckmoe    the Qwen3-30B-A3B-shaped random bf16 checkpoint in $MOE (61 GB; skipped if present)
#   tpot     single stream on it: 1 prompt of 1024 in / 256 out (bench_offline; an 8-sequence
#            bucket, decode bursts of 8, as gpu_quant.sh measures one stream), beside the read
#            time of the weights one decode token reads (bench/active_weights.py) at the card's
#            measured copy bandwidth
#   off      offline, $N x 256/256 (bench_offline)
#   qoff<in>:<out>:<n>[:fp8]  offline on $MOE as a new user runs it: no config, no KV pool
#            given, <n> prompts of <in> / <out> tokens, bf16 or fp8 experts (--quantization fp8)
#            (issue 55's workloads: qoff256:256:1000 qoff1000:1000:1000 and their :fp8)
#   prof<N>[:<ctx>]  where a decode step of N sequences x ctx (1024) tokens on $MOE goes, no config
#            (investigations/profile_step.py: wall, device time by kernel family), beside the
#            card's read ceiling (a reduction that only reads) and the weights that step reads
#            (bench/active_weights.py) measured in the same call: read_ceiling.json
#   gmm      the experts' grouped matmul at decode batch 1, 64, 256: jax.lax.ragged_dot and the
#            Pallas kernel, the whole routed FFN (through the kernel, and through ragged_dot),
#            and the dense references (investigations/bench_grouped_matmul.py)
#   serve    the multi-process HTTP server (jaxserve serve, --warmup full) under
#            `jaxserve bench serve`'s load generator (jaxserve/bench/serve_vs_offline.py): the
#            $SVO_N x 256/256 burst, rates 16 and inf at 1024/128 (range ratio 0.5), one stream;
#            TTFT / TPOT / ITL p50 and p99
#   ep1      one device, offline 128 x 256/256 (greedy): the reference for ep2
#   ep2      2 GPUs: tensor parallel 2 and expert parallel 2 (--enable-expert-parallel) on ep1's
#            prompts, step time and whether each request's tokens match the one-device run's
#            (bench_offline's token digests)
#   ep1inv   one device with tp_invariant_reductions, its experts cut as tensor parallel 2 and as
#            expert parallel 2 cut them (models/invariant_experts.py): the references of ep2inv
#   ep2inv   tensor parallel 2 and expert parallel 2 with tp_invariant_reductions: tokens equal
#            to ep1inv's, bit for bit
#   ckgemma  the Gemma-3-12B-shaped random bf16 checkpoint in $GEMMA, and ${GEMMA}_nowin: the
#            same weights with every sliding window as long as the model's context (windows off)
#   gemma    offline $N x 1024/128 and $N8K x 8192/256, windows on and off, with the KV pool's
#            token capacity (g1k and g8k: one length each)
#   gtpot    single stream on the Gemma checkpoint, 1024 in / 256 out, beside its weight-read time
#   ckmix    the Mixtral-8x7B-shaped random checkpoint written in fp8 (compressed-tensors, 47 GB)
#            in $MIX (default /dev/shm/mixtral_fp8; skipped if present)
#   mix<in>:<out>:<n>  offline on it with fp8 KV pages, configs/h100-offline.yaml, $n prompts of
#            <in> / <out> tokens (TensorRT-LLM's workloads: mix128:128:2000 mix1000:1000:1000
#            mix2048:128:500)
#   table    the short table of every result in $OUT (scripts/gpu_moe_table.py); always run last
# The older steps (tpot, off, serve, ep*) give the MoE's KV pool in bytes (MOE_KV_GIB, default 8)
# as they did when the loader's slack left a 61 GB checkpoint no pool on an 80 GB card; qoff
# leaves it to the planner. The wheels jaxserve needs beyond the device image are carried
# in .whl/. CPU check on tiny shapes: tests/scripts/test_gpu_moe_script.py.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # $OUT, $LOGS, the carried wheels, step()
MOE=${MOE:-/tmp/qwen3moe}; GEMMA=${GEMMA:-/tmp/gemma12b}; CONFIG=${CONFIG:-configs/h100.yaml}
N=${N:-1000}; N8K=${N8K:-64}; SVO_N=${SVO_N:-1000}; LONG_IN=${LONG_IN:-8192}; LONG_OUT=${LONG_OUT:-256}
MOE_SET=(--set cache.memory_fraction=0.95 --set "cache.memory_bytes=$(( ${MOE_KV_GIB:-8} << 30 ))")
# ep1 and ep2: the same 128 prompts and batch ladder on one device and on two; one sequence rung
# and two token rungs, so that each run compiles a few programs (a MoE program takes 4-16 s)
EP=(--num-prompts 128 --input-len 256 --output-len 256 --max-model-len 512 --max-num-seqs 128
  --max-num-batched-tokens 4096 --set "scheduler.seq_buckets=[128]"
  --set "scheduler.token_buckets=[128,4096]")
GEMMA_SET=(--set attention_backend=${GEMMA_ATTN:-pallas_gpu})
# one stream as issue 26 measured it (gpu_quant.sh's t step): an 8-sequence bucket, bursts of 8
SINGLE=(--max-num-seqs 8 --max-num-batched-tokens 1024 --set "scheduler.seq_buckets=[8]"
  --set "scheduler.token_buckets=[8,1024]" --set scheduler.num_scheduler_steps=8)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
python3 -c "import jax; print('jax', jax.__version__, jax.devices()[0].device_kind)" | tee -a "$OUT/summary.txt"
offline() { local name=$1 model=$2; shift 2
  step "$name" python3 -m jaxserve.bench.bench_offline --model "$model" --config "$CONFIG" \
    --no-stream --log-level WARNING --out "$OUT/$name.json" "$@"; }
copy_bandwidth() {  # the card's measured copy bandwidth, once per run
  [ -f "$OUT/copy_bandwidth.json" ] || python3 -c "import json; \
from investigations.kernel_timing import copy_bandwidth as c; \
print(json.dumps({'copy_gb_per_s': c(${COPY_BYTES:-4294967296}, inner=10, reps=5) / 1e9}))" \
    > "$OUT/copy_bandwidth.json" 2> "$LOGS/copy_bandwidth.log"; }
gemma_run() {  # gemma_run LABEL on|off PROMPTS IN OUT: offline on the windowed or unwindowed copy
  local model=$GEMMA; [ "$2" = off ] && model=${GEMMA}_nowin
  offline "gemma_$1_$2" "$model" "${GEMMA_SET[@]}" --num-prompts "$3" --input-len "$4" \
    --output-len "$5" --max-model-len $(( $4 + $5 )); }
checkpoint() {  # checkpoint SHAPE DIR: a named shape's random checkpoint, unless DIR has one
  [ -f "$2/config.json" ] || step "ck_$1" python3 -m jaxserve.bench.random_checkpoint "$1" "$2"
  du -sh "$2" | tee -a "$OUT/summary.txt"; }
for s in ${STEPS:-ckmoe tpot off gmm serve ckgemma gtpot gemma} table; do case $s in
  ckmoe) checkpoint qwen3-30b-a3b "$MOE" ;;
  tpot)
    offline moe_tpot "$MOE" "${MOE_SET[@]}" "${SINGLE[@]}" --num-prompts 1 --input-len 1024 --output-len 256 \
      --max-model-len 2048
    python3 -m jaxserve.bench.active_weights "$MOE" > "$OUT/moe_active.json"
    copy_bandwidth ;;
  off) offline moe_off "$MOE" "${MOE_SET[@]}" --num-prompts "$N" --input-len 256 --output-len 256 \
      --max-model-len 512 ;;
  prof*) IFS=: read -r n ctx <<< "${s#prof}"; name="moe_prof${n}_${ctx:=1024}"
    step "$name" python3 -m investigations.profile_step --model "$MOE" --max-model-len 2048 \
      --num-seqs "$n" --context "$ctx" --trace-top 12 --trace-by-family --out "$OUT/$name.json"
    tr '\r' '\n' < "$LOGS/$name.log" | grep -v "it/s\]" | sed -n "/KV pool/,/^{/p" | head -n 32
    [ -f "$OUT/read_ceiling.json" ] || python3 -c "import json; \
from investigations.kernel_timing import read_bandwidth as r; \
print(json.dumps({'read_gb_per_s': r(${COPY_BYTES:-4294967296}, inner=10, reps=5) / 1e9}))" \
      | tee "$OUT/read_ceiling.json"
    [ -f "$OUT/moe_active.json" ] || python3 -m jaxserve.bench.active_weights "$MOE" > "$OUT/moe_active.json" ;;
  qoff*) IFS=: read -r il ol n q <<< "${s#qoff}"; name="moe_nc_${il}_${ol}${q:+_$q}"
    step "$name" python3 -m jaxserve.bench.bench_offline --model "$MOE" --no-stream \
      --log-level WARNING --num-prompts "$n" --input-len "$il" --output-len "$ol" \
      --max-model-len $(( il + ol )) ${q:+--quantization $q} --out "$OUT/$name.json" ;;
  gmm) step gmm python3 -m investigations.bench_grouped_matmul --batches 1,64,256 \
      --out "$OUT/gmm.json" ${GMM_FLAGS:-} ;;
  serve) TAIL=40 step serve python3 -m jaxserve.bench.serve_vs_offline --model "$MOE" \
      --config "$CONFIG" --max-model-len 2048 "${MOE_SET[@]}" --modes multi-process \
      --num-prompts "$SVO_N" --input-len 256 --output-len 256 --sweep-rates 16,inf \
      --sweep-input-len 1024 --sweep-output-len 128 --sweep-seconds "${SWEEP_S:-30}" \
      --sweep-inf-prompts "${SWEEP_INF:-500}" --single-stream-prompts 4 \
      --out-dir "$OUT/moe_serve" ${SVO_FLAGS:-} ;;
  ep1) offline moe_one "$MOE" "${MOE_SET[@]}" "${EP[@]}" ;;
  ep2)
    offline moe_tp2 "$MOE" --set tensor_parallel_size=2 "${EP[@]}"
    offline moe_ep2 "$MOE" --set tensor_parallel_size=2 --set enable_expert_parallel=true "${EP[@]}" ;;
  ep1inv) for ep in false true; do
      offline "moe_one_inv_$([ $ep = true ] && echo ep || echo tp)" "$MOE" "${MOE_SET[@]}" "${EP[@]}" \
        --set tp_invariant_reductions=true --set enable_expert_parallel=$ep
    done ;;
  ep2inv)
    offline moe_tp2_inv "$MOE" --set tensor_parallel_size=2 --set tp_invariant_reductions=true "${EP[@]}"
    offline moe_ep2_inv "$MOE" --set tensor_parallel_size=2 --set tp_invariant_reductions=true \
      --set enable_expert_parallel=true "${EP[@]}" ;;
  ckgemma)
    checkpoint gemma-3-12b "$GEMMA"
    mkdir -p "${GEMMA}_nowin" && for f in "$GEMMA"/*; do
      [ "$(basename "$f")" = config.json ] || ln -sf "$f" "${GEMMA}_nowin/"; done
    python3 - "$GEMMA" <<'PY'
import json, sys
config = json.load(open(f"{sys.argv[1]}/config.json"))
config["sliding_window"] = config["max_position_embeddings"]  # every window covers the context
json.dump(config, open(f"{sys.argv[1]}_nowin/config.json", "w"), indent=2)
PY
    ;;
  gemma) for win in on off; do gemma_run 1k "$win" "$N" 1024 128; done
    for win in on off; do gemma_run 8k "$win" "$N8K" "$LONG_IN" "$LONG_OUT"; done ;;
  g1k) for win in on off; do gemma_run 1k "$win" "$N" 1024 128; done ;;
  g8k) for win in on off; do gemma_run 8k "$win" "$N8K" "$LONG_IN" "$LONG_OUT"; done ;;
  gtpot)
    offline gemma_tpot "$GEMMA" "${GEMMA_SET[@]}" "${SINGLE[@]}" --num-prompts 1 --input-len 1024 \
      --output-len 256 --max-model-len 2048
    python3 -m jaxserve.bench.active_weights "$GEMMA" > "$OUT/gemma_active.json"
    copy_bandwidth ;;
  ckmix) [ -f "${MIX:-/dev/shm/mixtral_fp8}/config.json" ] || step ckmix python3 -m \
      jaxserve.bench.random_checkpoint mixtral-8x7b "${MIX:-/dev/shm/mixtral_fp8}" --quantization fp8
    du -sh "${MIX:-/dev/shm/mixtral_fp8}" | tee -a "$OUT/summary.txt" ;;
  mix*) IFS=: read -r il ol n <<< "${s#mix}"
    CONFIG=configs/h100-offline.yaml offline "mixtral_fp8_${il}_${ol}" "${MIX:-/dev/shm/mixtral_fp8}" \
      --kv-cache-dtype fp8 --num-prompts "$n" --input-len "$il" --output-len "$ol" \
      --max-model-len $(( il + ol )) ;;
  table) python3 scripts/gpu_moe_table.py "$OUT" | tee -a "$OUT/summary.txt" ;;
  *) echo "unknown step $s" | tee -a "$OUT/summary.txt" ;;
esac; done
