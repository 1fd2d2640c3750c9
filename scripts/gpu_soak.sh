#!/usr/bin/env bash
# The GPU soak of issue 32 on a 2-GPU machine: two `jaxserve serve` of the 8B-shaped random
# checkpoint side by side, batch_invariant on (GPU 0, canaries must match) and off (GPU 1), each
# held by `jaxserve bench soak` at $LOAD (1.5) x its measured capacity for $DURATION (600) s
# with 10% cancels, 5% bad inputs, an API server process killed every $KILL_EVERY (120) s and a
# stalled reader every 90 s, its calls from $CLIENTS (4) client processes. A soak outlives one
# 10-minute device call, so the servers and soaks start in their own process sessions (setsid:
# they run on between calls while the machine is held) and write to $SOAK (/tmp/soak):
#   STEPS=start    the checkpoint (if $MODEL has none, 2-3 min), both servers, both soaks; then
#                  waits as `wait` does until $WAIT_S (480) s have passed
#   STEPS=wait     until both soaks have ended (at most $WAIT_S s), then the results to $OUT:
#                  soak_on.json / soak_off.json (rows, summary, problems), their logs and the
#                  servers' logs, and the two soaks' tables; stops the servers once both ended
# Each soak starts once every server answers /health, so both measure their capacity at once.
# The servers use $SOAK/bpe, the synthetic byte-level BPE of bench_structured with the
# checkpoint's chat template (the random checkpoint's word-level tokenizer cannot write JSON).
# One GPU: GPUS="0 0" API_SERVERS=2 CLIENTS=3 SERVE_FLAGS="--set cache.memory_fraction=0.45"
# (the two servers share the card: each is the other's neighbour).
# e.g. STEPS=start, then (within 30 s of its return, so the machine stays held) STEPS=wait.
# A CPU dry run (not in the suite: two servers and two soaks): MODEL=tiny-random SHAPE=none
# CONFIG=configs/tiny-random-cpu.yaml DURATION=40 KILL_EVERY=15 CAPACITY_S=5 CLIENTS=2 WAIT_S=200.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # $OUT, $LOGS, the carried wheels, step()
MODEL=${MODEL:-/tmp/llama8b}; SHAPE=${SHAPE:-llama-3.1-8b}; CONFIG=${CONFIG:-configs/h100.yaml}
SOAK=${SOAK:-/tmp/soak}; DURATION=${DURATION:-600}; KILL_EVERY=${KILL_EVERY:-120}
WAIT_S=${WAIT_S:-480}; CLIENTS=${CLIENTS:-4}; LOAD=${LOAD:-1.5}; GPUS=(${GPUS:-0 1})
MODES=(${MODES:-on off}); T0=$SECONDS; mkdir -p "$SOAK"; PORTS=()
for k in "${!MODES[@]}"; do PORTS+=($((8000 + k))); done
tokenizer() {  # the synthetic byte-level BPE of bench_structured with the checkpoint's chat
  # template: the random checkpoint's word-level tokenizer has no JSON punctuation, so the
  # soak's JSON schema would match no output
  python3 -c "
import json; from pathlib import Path
from jaxserve.bench.bench_structured import write_synthetic_tokenizer as w
m = Path('$MODEL'); cfg = json.loads((m / 'tokenizer_config.json').read_text())
w(128000, json.loads((m / 'config.json').read_text())['vocab_size'], Path('$SOAK/bpe'), cfg['chat_template'])"
  }
start_one() {  # start_one MODE GPU PORT: a server and, once it is ready, its soak
  local mode=$1 gpu=$2 port=$3 flags=() must=()
  [ "$mode" = on ] && flags=(--set batch_invariant=true) && must=(--canaries-must-match)
  CUDA_VISIBLE_DEVICES=$gpu setsid nohup python3 -m jaxserve.cli serve "$MODEL" --config "$CONFIG" ${TOKENIZER:+--tokenizer $TOKENIZER} \
    --max-model-len ${MAX_MODEL_LEN:-2048} --port "$port" --warmup full \
    --api-server-count ${API_SERVERS:-4} "${flags[@]}" ${SERVE_FLAGS:-} \
    > "$SOAK/server_$mode.log" 2>&1 < /dev/null &
  setsid nohup bash -c "for p in ${PORTS[*]}; do for i in \$(seq 450); do python3 -c 'import urllib.request as u, sys; u.urlopen(f\"http://127.0.0.1:{sys.argv[1]}/health\")' \$p 2>/dev/null && break; sleep 2; done; done;
    python3 -m jaxserve.cli bench soak --base-url http://127.0.0.1:$port --duration $DURATION \
      --load $LOAD --kill-api-every $KILL_EVERY --stall-every ${STALL_EVERY:-90} \
      --capacity-concurrency ${CAPACITY_CONCURRENCY:-512} --capacity-seconds ${CAPACITY_S:-20} \
      --client-processes $CLIENTS --max-tokens ${MAX_TOKENS:-64} ${must[*]} \
      --out $SOAK/soak_$mode.json; echo \$? > $SOAK/soak_$mode.rc" \
    > "$SOAK/soak_$mode.log" 2>&1 < /dev/null &
}
ended() { for mode in "${MODES[@]}"; do [ -f "$SOAK/soak_$mode.rc" ] || return 1; done; }
wait_and_collect() {
  while ! ended && [ $((SECONDS - T0)) -lt "$WAIT_S" ]; do sleep 10; done
  for mode in "${MODES[@]}"; do
    echo "--- soak $mode: rc $(cat "$SOAK/soak_$mode.rc" 2>/dev/null || echo running)" | tee -a "$OUT/summary.txt"
    grep -v "it/s\]\|HTTP Request" "$SOAK/soak_$mode.log" | tail -n 25 | tee -a "$OUT/summary.txt"
  done
  cp "$SOAK"/*.json "$OUT/" 2>/dev/null  # the plot is drawn from them (plots.soak_timeline)
  for f in "$SOAK"/*.log; do tail -c 200000 "$f" > "$OUT/$(basename "$f")"; done
  if ended; then pkill -f "jaxserve.cli serve" ; sleep 5; fi
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tee -a "$OUT/summary.txt"
}
for s in ${STEPS:-start}; do case $s in
  start)
    [ "$SHAPE" = none ] || [ -f "$MODEL/config.json" ] || step ck python3 -m jaxserve.bench.random_checkpoint "$SHAPE" "$MODEL"
    [ "$SHAPE" = none ] || step tokenizer tokenizer
    [ "$SHAPE" = none ] || TOKENIZER=$SOAK/bpe
    for k in "${!MODES[@]}"; do start_one "${MODES[$k]}" "${GPUS[$k]}" "${PORTS[$k]}"; done
    wait_and_collect ;;
  wait) wait_and_collect ;;
  *) echo "unknown step $s" | tee -a "$OUT/summary.txt" ;;
esac; done
