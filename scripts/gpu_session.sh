#!/usr/bin/env bash
# One device session on a GPU machine: kernel tests on the real GPU, the kernel benchmark,
# the engine parity tests with the Pallas kernel, and the offline benchmark, plus the steps
# below. JSON results go to $OUT, logs to $LOGS (the device tool returns few files).
set -uo pipefail
OUT=${OUT:-out}; LOGS=${LOGS:-/tmp/gpu_logs}; mkdir -p "$OUT" "$LOGS"
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
  "$@" > "$LOGS/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc ($((SECONDS - t0)) s)"; grep -v "it/s]\|s/it]\|^ \|^[{}]" "$LOGS/$name.log" | tail -n "${TAIL:-15}"; }
# The pytest steps run in one process (-n0 over the suite's `-n auto`): a worker per core would
# each take the GPU's memory, and the later ones fail to allocate.
for s in ${STEPS:-kernels bench_kernels engine bench_offline}; do
  case $s in
    kernels) step kernels python3 -m pytest -n0 -p no:cacheprovider tests/pallas_kernels/test_gpu_kernel.py \
        tests/pallas_kernels/test_greedy_sample.py tests/pallas_kernels/test_fixed_tile_matmul.py \
        tests/models/test_batch_invariant_dense.py tests/models/test_gpu_weight_layout.py \
        tests/investigations/test_bench_kernels.py tests/investigations/test_bench_sampler.py ;;
    bench_kernels) TAIL=40 step bench_kernels python3 -m investigations.bench_kernels --out "$OUT/bench_kernels.json" ;;
    engine) step engine python3 -m pytest -n0 -p no:cacheprovider tests/integration/test_gpu_engine.py ;;
    model1b) [ -f /tmp/llama1b/config.json ] || step model1b python3 -c \
        "from jaxserve.bench.random_checkpoint import build_random_model as b; b('llama-3.2-1b', '/tmp/llama1b')" ;;
    sync1b|async1b|async1b_512|async1b_512_cublas|async1b_512_burst4)  # the throughput workload
      engine=(--set scheduler.max_num_seqs=256 --set scheduler.max_num_batched_tokens=4096
              --set "scheduler.seq_buckets=[64,256]" --set "scheduler.token_buckets=[256,1024,4096]")
      [ $s = sync1b ] && engine+=(--set scheduler.async_scheduling=false)
      [ "${s#async1b_512}" != "$s" ] && engine=(--set scheduler.max_num_seqs=512
          --set scheduler.max_num_batched_tokens=8192 --set "scheduler.seq_buckets=[64,512]"
          --set "scheduler.token_buckets=[512,2048,8192]")
      [ $s = async1b_512_burst4 ] && engine+=(--set scheduler.num_scheduler_steps=4)
      [ -n "${PROFILE_HOST:-}" ] && engine+=(--profile-host "$OUT/$s.prof.txt")
      xla_flags=${XLA_FLAGS:-}  # _cublas: every GEMM on cuBLAS instead of XLA's Triton GEMMs
      [ $s = async1b_512_cublas ] && xla_flags="$xla_flags --xla_gpu_enable_triton_gemm=false"
      XLA_FLAGS=$xla_flags TAIL=22 step $s python3 -m jaxserve.bench.bench_offline --model /tmp/llama1b --num-prompts 512 \
        --input-len 512 --output-len 128 --max-model-len 640 --log-level WARNING "${engine[@]}" \
        --no-stream --out "$OUT/$s.json" ;;
    o512+*|tp512+*)  # 512 sequences per batch, options joined by '+': t<max_num_batched_tokens>,
      # b<num_scheduler_steps>, sb (seq buckets 64,128,256,512), xla (gpu_gemm=xla: XLA may
      # pick Triton GEMMs), nomerge (XLA does not merge GEMMs sharing an input, which
      # concatenates their weights every step), nofuse (fuse_projections=false), lt (XLA calls
      # cuBLASLt instead of cuBLAS), cb (gpu_gemm=cublas), xs (sampler_backend=xla), pf (scheduler.prefill_first),
      # bi (batch_invariant);
      # o512: bench_offline.py, tp512: jaxserve bench throughput with the transformers baseline.
      # E.g. tp512+b4, o512+t16384+b4+sb+xla
      tokens=8192; seqs="[64,512]"; xla=""; engine=(--set scheduler.max_num_seqs=512)
      IFS=+ read -ra opts <<< "${s#*+}"
      for o in "${opts[@]}"; do case $o in
        bi) engine+=(--set batch_invariant=true) ;;
        t*) tokens=${o#t} ;; b*) engine+=(--set scheduler.num_scheduler_steps=${o#b}) ;;
        sb) seqs="[64,128,256,512]" ;; xla) engine+=(--set gpu_gemm=xla) ;;
        nomerge) xla="$xla --xla_disable_hlo_passes=dot_merger" ;;
        lt) xla="$xla --xla_gpu_enable_cublaslt=true" ;;
        nofuse) engine+=(--set fuse_projections=false) ;;
        cb) engine+=(--set gpu_gemm=cublas) ;; xs) engine+=(--set sampler_backend=xla) ;;
        pf) engine+=(--set scheduler.prefill_first=true) ;;
        esac; done
      engine+=(--set scheduler.max_num_batched_tokens=$tokens --set "scheduler.seq_buckets=$seqs"
               --set "scheduler.token_buckets=[512,2048,$tokens]")
      common=(--model /tmp/llama1b --num-prompts 512 --input-len 512 --output-len 128
              --max-model-len 640 --log-level WARNING "${engine[@]}")
      name=${s//+/_}
      saved_xla_flags=${XLA_FLAGS-}
      [ -n "$xla" ] && export XLA_FLAGS="${XLA_FLAGS:-} $xla"
      if [ "${s%%+*}" = o512 ]; then
        TAIL=22 step $name python3 -m jaxserve.bench.bench_offline "${common[@]}" --no-stream \
          --out "$OUT/$name.json"
      else
        TAIL=12 step $name python3 -m jaxserve.cli bench throughput "${common[@]}" \
          --hf-baseline --hf-batch-size 128 --out "$OUT/$name.json"
      fi
      if [ -n "$saved_xla_flags" ]; then XLA_FLAGS=$saved_xla_flags; else unset XLA_FLAGS; fi ;;
    throughput1b) TAIL=12 step throughput1b python3 -m jaxserve.cli bench throughput \
        --model /tmp/llama1b --hf-baseline --hf-batch-size 128 --num-prompts 512 --input-len 512 \
        --output-len 128 --max-model-len 640 --log-level WARNING --set scheduler.max_num_seqs=256 \
        --set scheduler.max_num_batched_tokens=4096 --set "scheduler.seq_buckets=[64,256]" \
        --set "scheduler.token_buckets=[256,1024,4096]" --out "$OUT/bench_throughput_1b.json" ;;
    throughput1b_512*)  # all 512 prompts in one batch; throughput1b_512_2 etc. repeat it
      TAIL=12 step $s python3 -m jaxserve.cli bench throughput \
        --model /tmp/llama1b --hf-baseline --hf-batch-size 128 --num-prompts 512 --input-len 512 \
        --output-len 128 --max-model-len 640 --log-level WARNING --set scheduler.max_num_seqs=512 \
        --set scheduler.max_num_batched_tokens=8192 --set "scheduler.seq_buckets=[64,512]" \
        --set "scheduler.token_buckets=[512,2048,8192]" --out "$OUT/$s.json" ;;
    profile1b) TAIL=40 step profile1b python3 -m investigations.profile_step --model /tmp/llama1b \
        --num-seqs 256 --context 576 --max-model-len 640 --trace-top ${TRACE_TOP:-0} --trace-by-family --trace-reps 3 \
        --set scheduler.max_num_seqs=256 --set "scheduler.seq_buckets=[256]" \
        --set "scheduler.token_buckets=[256,4096]" --set scheduler.max_num_batched_tokens=4096 \
        --out "$OUT/profile1b.json" ;;
    server_startup)  # issue 16: fresh start, background compile, mixed workload, warm restart
      TAIL=20 step server_startup python3 -m jaxserve.bench.bench_server_startup --model /tmp/llama8b \
        --config configs/h100.yaml --max-model-len 2048 --workload-s "${WORKLOAD_S:-120}" \
        --out "$OUT/server_startup.json"
      cp "$OUT"/server_fresh.log "$OUT"/server_restart.log "$LOGS"/ 2>/dev/null ;;
    server_startup_bi)  # issue 16: is the request served while padded to the first bucket the
      # same as once every bucket is compiled (and after the restart)? Only batch_invariant makes
      # the GPU's tokens independent of the bucket, so the comparison runs in that mode.
      TAIL=20 step server_startup_bi python3 -m jaxserve.bench.bench_server_startup --model /tmp/llama8b \
        --config configs/h100.yaml --max-model-len 2048 --workload-s "${WORKLOAD_S:-5}" \
        --set batch_invariant=true --out "$OUT/server_startup_bi.json" ;;
    tpot8b|tpot8b+t8)  # single-stream decode of the 8B: one 1024-token prompt, 256 greedy tokens
      # (h100.yaml; +t8: a token bucket of 8 under the default 16, as the smallest seq bucket)
      flags=(); [ $s = tpot8b+t8 ] && flags=(--set "scheduler.token_buckets=[8,16,32,64,128,256,512,1024,2048]")
      TAIL=12 step ${s//+/_} python3 -m jaxserve.bench.bench_offline --model /tmp/llama8b \
        --config configs/h100.yaml --num-prompts 1 --input-len 1024 --output-len 256 \
        --max-model-len 2048 --log-level WARNING --no-stream "${flags[@]}" --out "$OUT/${s//+/_}.json" ;;
    startup8b)  # issue 16: weight loads in both memory layouts (holes), the KV pool h100.yaml gets
      TAIL=16 step startup8b python3 -m jaxserve.bench.bench_startup --model /tmp/llama8b \
        --config configs/h100.yaml --max-model-len 2048 --load-runs 1 --out "$OUT/bench_startup.json" ;;
    sampler_modes) TAIL=14 step sampler_modes python3 -m investigations.bench_sampler_modes \
        --rows 256 --vocab 128256 --out "$OUT/sampler_modes.json" ;;
    model8b) [ -f /tmp/llama8b/config.json ] || step model8b python3 -c \
        "from jaxserve.bench.random_checkpoint import build_random_model as b; b('llama-3.1-8b', '/tmp/llama8b')" ;;
    structured8b)  # issue 18: every request under a JSON schema vs unconstrained, 64 and 256
      # sequences, 8B random weights with a Llama-3-sized byte-level BPE (needs step model8b)
      TAIL=8 step structured8b python3 -m jaxserve.bench.bench_structured --model /tmp/llama8b \
        --synthetic-bpe-vocab 128000 --concurrency 64 256 --input-len 128 --output-len 256 \
        --max-model-len 512 --log-level WARNING --set scheduler.max_num_seqs=256 \
        --set scheduler.max_num_batched_tokens=4096 --set "scheduler.seq_buckets=[64,256]" \
        --set "scheduler.token_buckets=[256,1024,4096]" --out "$OUT/bench_structured.json" ;;
    tp_tests) step tp_tests python3 -m pytest -n0 -p no:cacheprovider tests/parallel/test_gpu_tensor_parallel.py ;;
    tp_invariant|tp_default)  # 2 GPUs: parity and decode step time, tp=1 against tp=2
      flags=(); [ $s = tp_invariant ] && flags=(--tp-invariant)
      TAIL=12 step $s env NCCL_NVLS_ENABLE=0 python3 -m investigations.bench_tp --model /tmp/llama8b \
        --tp 1,2 --batch 128 --context 512 --decode-steps 32 "${flags[@]}" --out "$OUT/$s.json" ;;
    profile512|profile512_prefill)  # the 512-sequence throughput config: decode or prefill step
      phase=decode; [ $s = profile512_prefill ] && phase=prefill
      TAIL=40 step $s python3 -m investigations.profile_step --model /tmp/llama1b --phase $phase \
        --num-seqs 512 --context $([ $phase = decode ] && echo 576 || echo 512) --max-model-len 640 \
        --trace-top ${TRACE_TOP:-25} --trace-by-family --trace-ops --trace-reps 3 \
        --set scheduler.max_num_seqs=512 --set "scheduler.seq_buckets=[64,512]" \
        --set "scheduler.token_buckets=[512,2048,8192]" --set scheduler.max_num_batched_tokens=8192 \
        --out "$OUT/$s.json" ;;
    kernels_dev) TAIL=30 step kernels_dev python3 -m investigations.bench_kernels --batches 64,256 \
        --contexts 512,2048 --no-mixed --harness unrolled --device-time --out "$OUT/kernels_dev.json" ;;
    kernels_short) TAIL=30 step kernels_short python3 -m investigations.bench_kernels --batches 64,256 \
        --contexts 512,2048 --no-mixed --harness marginal --inner 10 --device-time \
        --out "$OUT/kernels_short.json" ;;
    tiles_1b)  # the 1B throughput workload's attention shapes: 512-sequence decode at context
      # 576 and a 16 x 512 prefill, head_dim 64; tiles block_kv:warps:stages[:splits[:block_q]]
      TAIL=45 step tiles_1b python3 -m investigations.bench_kernels --head-dim 64 --batches 512 \
        --contexts 576 --no-mixed --prefill 16x512 --harness marginal --inner 10 --device-time \
        --tiles "${TILES:-default,64:4:3,128:4:3,64:8:3,32:4:4,64:4:3:1:32,128:8:3:1:32,64:8:2:1:32}" \
        --out "$OUT/tiles_1b.json" ;;
    bench_kernels_marginal) TAIL=45 step bench_kernels_marginal python3 -m investigations.bench_kernels \
        --harness marginal --inner 10 --device-time --out "$OUT/bench_kernels_marginal.json" ;;
    sampler) TAIL=14 step sampler python3 -m investigations.bench_sampler --out "$OUT/bench_sampler.json" ;;
    filter_search)  # the sort-free top-k / top-p filter against the sampler's sort, 256 x 128k and 64 x 128k
      step filter_search python3 -m investigations.sampling_filter_threshold --agree --time
      step filter_search64 python3 -m investigations.sampling_filter_threshold --time --rows 64 ;;
    gemm) TAIL=30 step gemm python3 -m investigations.gemm_invariance --out "$OUT/gemm_invariance.json" ;;
    tiles_short) TAIL=30 step tiles_short python3 -m investigations.bench_kernels --batches 64,256 \
        --contexts 512 --no-mixed --harness marginal --inner 10 --device-time --tiles "${TILES:-default,32:4:4:1,64:4:3:2,128:4:3:2,64:4:4:2,32:4:4:2,32:4:3:4,16:4:4:1}" \
        --out "$OUT/tiles_short.json" ;;
    tpot1b|tpot1b+bi)  # single-stream decode: one 512-token prompt, 512 greedy tokens (h100.yaml)
      flags=(); [ $s = tpot1b+bi ] && flags=(--set batch_invariant=true)
      TAIL=22 step ${s//+/_} python3 -m jaxserve.bench.bench_offline --model /tmp/llama1b \
        --config configs/h100.yaml --num-prompts 1 --input-len 512 --output-len 512 \
        --max-model-len 1100 --log-level WARNING --no-stream --set warmup=full "${flags[@]}" \
        --out "$OUT/${s//+/_}.json" ;;
    invariance)  # issue 17: greedy tokens/logprobs alone vs in 200 others vs preempted vs prefix
      # cache hit, and the component checks, batch_invariant off and on (INV_MODELS, INV_MODES)
      for m in ${INV_MODELS:-1b 8b}; do for mode in ${INV_MODES:-off on}; do
        TAIL=${INV_TAIL:-95} step invariance_${m}_$mode python3 -m jaxserve.bench.batch_invariance \
          --model /tmp/llama$m --config configs/h100.yaml --batch-invariant $mode --num-probes 8 \
          --num-tokens 128 --num-others 200 --set compilation_cache_dir=/tmp/xla-cache-inv \
          --components "${INV_COMPONENTS:-on}" \
          --out "$OUT/invariance_${m}_$mode.json"
      done; done ;;
    svo8b_warm)  # fills the compilation cache for svo8b: every program the servers compile (~2-3 min)
      [ -f /tmp/llama8b/config.json ] || step model8b python3 -c \
        "from jaxserve.bench.random_checkpoint import build_random_model as b; b('llama-3.1-8b', '/tmp/llama8b')"
      step svo8b_warm python3 -m jaxserve.bench.bench_offline --model /tmp/llama8b \
        --config configs/h100.yaml --max-model-len 2048 --num-prompts 64 --input-len 256 \
        --output-len 16 --warmup full --no-stream --log-level WARNING --out "$OUT/svo8b_warm.json" ;;
    svo8b)  # issue 15, one run (~8 min with svo8b_warm's cache): LLM.generate vs the multi-process
      # and the single-process HTTP server on 1000 x 256/256 at rate inf (every token streamed),
      # a rate sweep (1024/128, range ratio 0.5; rate x SWEEP_S seconds of prompts) and
      # single-stream TPOT against the weight-read time
      TAIL=30 step svo8b python3 -m jaxserve.bench.serve_vs_offline --model /tmp/llama8b \
        --config configs/h100.yaml --max-model-len 2048 --sweep-seconds ${SWEEP_S:-15} \
        --sweep-inf-prompts 200 --single-stream-prompts 4 --out-dir "$OUT/svo8b" ;;
    svo8b_api)  # the burst of svo8b on the multi-process server with SVO_API API processes
      # (default "4 8"), each process's CPU use printed; a short sweep (inf only), one stream
      for c in ${SVO_API:-4 8}; do
        TAIL=12 step svo8b_api$c python3 -m jaxserve.bench.serve_vs_offline --model /tmp/llama8b \
          --config configs/h100.yaml --max-model-len 2048 --modes multi-process \
          --api-server-count $c --sweep-rates inf --sweep-inf-prompts 50 \
          --single-stream-prompts 1 --out-dir "$OUT/svo8b_api$c"
      done ;;
    prefix8b)  # bench prefix-cache: 200 requests sharing a 2,000-token system prompt, on vs off
      TAIL=8 step prefix8b python3 -m jaxserve.bench.bench_prefix_cache --model /tmp/llama8b \
        --config configs/h100.yaml --max-model-len 4096 --prefix-len 2000 --suffix-len 32 \
        --num-prompts 200 --output-len 200 --request-rate ${PREFIX_RATE:-8} \
        --out "$OUT/prefix8b.json" ;;
    bench_offline) step bench_offline python3 -m jaxserve.bench.bench_offline --num-prompts 256 \
        --input-len 128 --output-len 128 --set scheduler.max_num_seqs=256 \
        --set scheduler.max_num_batched_tokens=2048 --out "$OUT/bench_offline.json" ;;
  esac
done
