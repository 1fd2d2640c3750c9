#!/usr/bin/env bash
# One call: the 8B burst over HTTP with no config (scripts/gpu_defaults_serve.sh's noconfig8b,
# --quick) on an older tree, then on this one, from empty compilation caches; each tree's JSON and
# server log in $OUT/before and $OUT/after. The older tree is extracted here first and carried:
#   mkdir -p .lead/before && git archive 8777b93 | tar -x -C .lead/before
#   run with carry [".whl", ".lead"]:  BEFORE=.lead/before bash scripts/gpu_before_after.sh
set -u
ROOT=$PWD; DEV_OUT=${OUT:-out}; BEFORE=${BEFORE:-.lead/before}
source scripts/gpu_common.sh  # the wheels; JAX pre-allocates as each server sets it
step ck8b python3 -m jaxserve.bench.random_checkpoint llama-3.1-8b /tmp/llama8b
ln -sfn "$ROOT/.whl" "$BEFORE/.whl"
for t in "before:$BEFORE" "after:."; do
  name=${t%%:*}; dir=${t#*:}; t0=$SECONDS
  (cd "$dir" && OUT=$DEV_OUT/$name LOGS=$DEV_OUT/logs_$name QUICK=--quick RATE_S=${RATE_S:-5} \
    RUNS="noconfig8b table" timeout "${LIMIT_S:-330}" bash scripts/gpu_defaults_serve.sh 2>&1 | tail -n 6)
  echo "=== $name $((SECONDS - t0)) s"
done
