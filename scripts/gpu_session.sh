#!/usr/bin/env bash
# One device session on a GPU machine: kernel tests on the real GPU, the kernel benchmark,
# the engine parity tests with the Pallas kernel, and the offline benchmark. Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 JAXSERVE_TEST_XLA_CACHE=/tmp/xla-cache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"
step() { local name=$1; shift; echo "=== $name"; local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc ($((SECONDS - t0)) s)"; tail -n "${TAIL:-15}" "$OUT/$name.log"; }
for s in ${STEPS:-kernels bench_kernels engine bench_offline}; do
  case $s in
    kernels) step kernels python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gpu_kernel.py ;;
    bench_kernels) TAIL=40 step bench_kernels python3 scripts/bench_kernels.py --out "$OUT/bench_kernels.json" ;;
    engine) step engine python3 -m pytest -q -p no:cacheprovider tests/integration/test_gpu_engine.py ;;
    bench_offline) step bench_offline python3 scripts/bench_offline.py --num-prompts 256 \
        --input-len 128 --output-len 128 --set scheduler.max_num_seqs=256 \
        --set scheduler.max_num_batched_tokens=2048 --out "$OUT/bench_offline.json" ;;
  esac
done
