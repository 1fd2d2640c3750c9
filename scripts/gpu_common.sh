# Sourced by the GPU session scripts (gpu_moe.sh, gpu_dp.sh, gpu_tp4.sh): $OUT for results and
# $LOGS for logs (created), the wheels jaxserve needs beyond the device image installed from
# .whl/ into /tmp/site (PYTHONPATH), unbuffered Python, and step NAME CMD...: runs CMD with its
# output in $LOGS/NAME.log, appends "=== NAME rc=RC (S s)" to $OUT/summary.txt and, on failure,
# prints the log's last $TAIL (20) lines.
OUT=${OUT:-out}; mkdir -p "$OUT"; LOGS=${LOGS:-/tmp/logs}; mkdir -p "$LOGS"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
step() { local name=$1; shift; local t0=$SECONDS
  "$@" > "$LOGS/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
  [ $rc = 0 ] || grep -v "it/s\]\|s/it\]" "$LOGS/$name.log" | tail -n "${TAIL:-20}"; }
