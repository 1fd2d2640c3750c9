#!/usr/bin/env bash
# Start-up to full speed on one GPU (issue 56): `jaxserve serve MODEL` with no config from an
# empty compilation cache, then a warm restart, by `jaxserve bench server-startup` (--tpot-probes:
# one stream and 4 x 512/64 right after /health and again once every program is compiled;
# --restart-wait: the restart's programs too). STEPS picks the runs: ck8b builds the
# Llama-3.1-8B-shaped random checkpoint if absent; t<N>_8b starts it with compile_threads=N
# (t0_8b: the default, a quarter of the host's cores; t<N>_8bfp8: fp8 weights and KV pages;
# t<N>_8bnoat: XLA's GPU autotuning off, to see what compiling's GPU work costs the requests
# served meanwhile); each run's JSON and server logs land in
# $OUT/<step>/. lp<phase>:<seqs>:<context> times that step of the 8B with the decoder's layers
# unrolled and as one program a layer (investigations/layer_programs.py: trace, lowering,
# compile and device time, same engine and batch). sl8b: sleep level 1 and wake on the 8B
# (investigations/sleep_wake.py: device bytes in use awake, asleep and after wake, sleep and wake
# seconds, greedy tokens before and after, compilations after wake) into $OUT/sleep_wake_8b.json.
# moeload: one load of the Qwen3-30B-A3B-shaped random bf16 checkpoint (61.1 GB) as a one-device
# engine does it (investigations/moe_load.py, a fresh process per layout in $MOE_LAYOUTS, default
# auto): the layout chosen, load seconds, bytes in use after it against the weights' bytes, the
# largest free block and the holes beside it, the peak during the load, the loader slack charged
# and the KV pool planned (and whether it allocates) into $OUT/moe_load_<layout>.json. The
# checkpoint is $MOE if set, else /dev/shm/qwen3moe if it holds one, else /tmp/qwen3moe (built
# there if absent, a minute or two).
# ckg12 / ckmoe build the Gemma-3-12B- / Qwen3-30B-A3B-shaped checkpoints in /dev/shm if absent,
# t<N>_g12 / t<N>_moe start them as t<N>_8b does the 8B.
# e.g. STEPS="ck8b t0_8b t1_8b" bash scripts/gpu_startup.sh; STEPS="ck8b sl8b" for sleep mode;
# STEPS="ckg12 t0_g12 ckmoe t0_moe" for the other two rows of the start-up table;
# STEPS=moeload MOE_LAYOUTS="auto streaming" for the MoE's load in both layouts
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # $OUT, $LOGS, the carried wheels, step()
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
startup() { local name=$1 model=$2 threads=$3; shift 3; mkdir -p "$OUT/$name"
  TAIL=40 step "$name" python3 -m jaxserve.bench.bench_server_startup --model "$model" \
    --max-model-len ${MAX_MODEL_LEN:-2048} --workload-s ${WORKLOAD_S:-20} --concurrency 32 \
    --tpot-probes --restart-wait --compile-timeout-s ${COMPILE_TIMEOUT_S:-420} \
    --set compile_threads=$threads --out "$OUT/$name/startup.json" "$@"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); f,w=r['fresh'],r['restart']; \
print(f'$name: /health {f[\"health_200_s\"]:.1f} s, all compiled {f[\"all_compiled_s\"]:.1f} s, \
TPOT at /health {f.get(\"tpot_at_ready_ms\")} all compiled {f.get(\"tpot_all_compiled_ms\")}; \
restart /health {w[\"health_200_s\"]:.1f} s all compiled {w.get(\"all_compiled_s\", 0):.1f} s')" \
    "$OUT/$name/startup.json" | tee -a "$OUT/summary.txt"; }
for s in ${STEPS:-ck8b t0_8b t1_8b}; do case $s in
  ck8b) [ -f /tmp/llama8b/config.json ] || step ck8b python3 -m jaxserve.bench.random_checkpoint llama-3.1-8b /tmp/llama8b ;;
  t*_8b) n=${s#t}; startup "$s" /tmp/llama8b "${n%_8b}" ;;
  t*_8bfp8) n=${s#t}; startup "$s" /tmp/llama8b "${n%_8bfp8}" --set quantization=fp8 --set cache.kv_cache_dtype=fp8 ;;
  t*_8bnoat) n=${s#t}; XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" startup "$s" /tmp/llama8b "${n%_8bnoat}" ;;
  ckg12) [ -f /dev/shm/gemma12b/config.json ] || step ckg12 python3 -m jaxserve.bench.random_checkpoint gemma-3-12b /dev/shm/gemma12b ;;
  t*_g12) n=${s#t}; startup "$s" /dev/shm/gemma12b "${n%_g12}" ;;
  ckmoe) [ -f /dev/shm/qwen3moe/config.json ] || step ckmoe python3 -m jaxserve.bench.random_checkpoint qwen3-30b-a3b /dev/shm/qwen3moe ;;
  t*_moe) n=${s#t}; startup "$s" /dev/shm/qwen3moe "${n%_moe}" ;;
  lp*) IFS=: read -r phase seqs ctx <<< "${s#lp}"
    step "$s" python3 -m investigations.layer_programs --model /tmp/llama8b --max-model-len 2048 \
      --phase "$phase" --num-seqs "$seqs" --context "$ctx" --out "$OUT/layer_programs_${phase}_${seqs}x${ctx}.json"
    grep -E "^(decode|prefill) " "$LOGS/$s.log" | tee -a "$OUT/summary.txt" ;;
  sl8b) step sl8b python3 -m investigations.sleep_wake --model /tmp/llama8b --max-model-len 2048 \
      --out "$OUT/sleep_wake_8b.json"
    grep -E "^(device bytes|driver bytes|sleep |wake |same greedy|compilations after)" "$LOGS/sl8b.log" | tee -a "$OUT/summary.txt" ;;
  moeload) moe=${MOE:-/tmp/qwen3moe}; [ -z "${MOE:-}" ] && [ -f /dev/shm/qwen3moe/config.json ] && moe=/dev/shm/qwen3moe
    [ -f "$moe/config.json" ] || step ckmoe python3 -m jaxserve.bench.random_checkpoint qwen3-30b-a3b "$moe"
    for layout in ${MOE_LAYOUTS:-auto}; do
      step "moeload_$layout" python3 -m investigations.moe_load --model "$moe" --layout "$layout" \
        --out "$OUT/moe_load_$layout.json"
      { grep -o "device memory: .*loader slack.*" "$LOGS/moeload_$layout.log"
        sed -n '/^layout  /,$p' "$LOGS/moeload_$layout.log"; } | sed "s/^/moeload $layout: /" | tee -a "$OUT/summary.txt"
    done ;;
  *) echo "unknown step $s" | tee -a "$OUT/summary.txt" ;;
esac; done
