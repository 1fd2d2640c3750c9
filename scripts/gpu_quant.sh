#!/usr/bin/env bash
# Quantization on one GPU, steps chosen by STEPS (docs/PERFORMANCE.md, "The 8B's single stream",
# "TensorRT-LLM's workloads", "Quantized GEMMs"):
#   smoke    1B-shaped random checkpoint, one engine per (quantization, KV dtype): greedy tokens
#            against bf16, pool pages, and how many of the step's GEMMs are cuBLASLt fp8 calls
#   smokekv  8-bit KV pages: the XLA path against the Pallas GPU kernel
#   ck8b     the Llama-3.1-8B-shaped random checkpoint in /tmp/llama8b
#   w<q>:<kv>:<in>:<out>:<n>  offline, configs/h100-offline.yaml (e.g. wfp8:auto:128:128:2000)
#   t<q>:<kv>[:<burst>[:<gemm>]]  single stream, 1 prompt of 128 in / 512 out, decode bursts of
#            <burst> steps (default 1), gpu_gemm <gemm> (default cublas), quantized_gemm <qgemm>
#            (default auto); counts GEMM kinds in the HLO
#   ak[<tiles>]  the GPU attention kernel on bfloat16, fp8 and int8 pages, 512 and 64 decode
#            sequences x 1,500 tokens, device time (investigations.bench_kernels --tiles <tiles>,
#            default "default,128:4:5,64:4:5,64:4:2,256:8:2")
#   mm[--sweep]  the 8B decode projections: pallas_kernels/quantized_matmul against XLA's GEMMs
#   p<q>:<kv>:<seqs>[:<gemm>[:<qgemm>]] the decode step's top kernels (investigations.profile_step)
#   o<q>:<kv>:<seqs>:<context>  the same with configs/h100-offline.yaml (its 512-row decode steps)
#   bitscheck  the kernel's fp8_bits conversion of every float8_e4m3fn value, on the GPU
#   fp8bits  later steps convert fp8 weights by bit operations in the Pallas kernel (sets
#            Tiling.fp8_bits' default in this run's copy of the tree, for a side-by-side run)
#   xp<P>    later steps run the quantize_x kernel with P persistent programs (Tiling.programs in
#            default_tiling, in this run's copy of the tree)
#   splits16 later steps split K up to 16 ways toward 528 programs (default_tiling's rule, in
#            this run's copy of the tree)
# The wheels jaxserve needs beyond the device image (msgspec, llguidance) are carried in .whl/.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; LOGS=/tmp/logs; mkdir -p $LOGS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
python3 -c "import jax; print('jax', jax.__version__)" | tee -a "$OUT/summary.txt"
for s in ${STEPS:-smoke}; do case $s in
  smoke)
    [ -f /tmp/llama1b/config.json ] || python3 -c "from jaxserve.bench.random_checkpoint import build_random_model as b; b('llama-3.2-1b', '/tmp/llama1b')" > $LOGS/ck1b.log 2>&1
    for qk in none:auto fp8:auto none:fp8 fp8:fp8 int8:auto; do q=${qk%:*}; k=${qk#*:}; d=/tmp/dump_${q}_${k}; rm -rf $d
      XLA_FLAGS="--xla_dump_to=$d --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*forward.*|.*step.*|.*burst.*" \
        python3 scripts/gpu_quant_smoke.py /tmp/llama1b $q $k /tmp/smoke_${q}_${k}.json > $LOGS/smoke_${q}_${k}.log 2>&1 || { echo "smoke $q $k FAILED"; tail -25 $LOGS/smoke_${q}_${k}.log; }
      grep -v "it/s\]" $LOGS/smoke_${q}_${k}.log | tail -2
      n8=$(cat $d/*after_optimizations.txt 2>/dev/null | grep -c 'custom_call_target="__cublas$lt$matmul$f8"'); nall=$(cat $d/*after_optimizations.txt 2>/dev/null | grep -c 'custom_call_target="__cublas')
      echo "  hlo: fp8 cublasLt gemms $n8 of $nall cublas calls; f8 tensors in convert fusions: $(cat $d/*after_optimizations.txt 2>/dev/null | grep -c 'f8e4m3fn\[[0-9]*,[0-9]*\]{[0-9,]*} fusion')" | tee -a "$OUT/summary.txt"
    done
    python3 - <<'PY' | tee -a "$OUT/summary.txt"
import json
b = json.load(open('/tmp/smoke_none_auto.json'))
for name in ['fp8_auto', 'none_fp8', 'fp8_fp8', 'int8_auto']:
  try: r = json.load(open(f'/tmp/smoke_{name}.json'))
  except Exception as e: print(name, 'missing'); continue
  agree = sum(x == y for k in b['tokens'] for x, y in zip(b['tokens'][k], r['tokens'][k]))
  first = sum(b['tokens'][k][0] == r['tokens'][k][0] for k in b['tokens'])
  print(f"{name}: greedy tokens equal to bf16 {agree}/{16*64}, first tokens {first}/16, pages {r['num_pages']} vs {b['num_pages']} ({r['num_pages']/b['num_pages']:.2f}x)")
PY
    ;;
  smokekv)
    [ -f /tmp/llama1b/config.json ] || python3 -c "from jaxserve.bench.random_checkpoint import build_random_model as b; b('llama-3.2-1b', '/tmp/llama1b')" > $LOGS/ck1b.log 2>&1
    for qkb in none:auto:xla none:fp8:xla none:fp8:pallas_gpu fp8:fp8:pallas_gpu; do IFS=: read -r q k b <<< "$qkb"
      python3 scripts/gpu_quant_smoke.py /tmp/llama1b $q $k /tmp/kv_${q}_${k}_${b}.json $b > $LOGS/kv_${q}_${k}_${b}.log 2>&1 || { echo "smoke $qkb FAILED"; grep -v "^E1127\|^W1127" $LOGS/kv_${q}_${k}_${b}.log | tail -8; }
      grep -v "it/s\]" $LOGS/kv_${q}_${k}_${b}.log | grep -i "capped\|build" | tail -2
    done
    python3 - <<'PY' | tee -a "$OUT/summary.txt"
import json
def load(n):
  try: return json.load(open(f'/tmp/kv_{n}.json'))
  except Exception: return None
for a, b in [('none_auto_xla', 'none_fp8_xla'), ('none_fp8_xla', 'none_fp8_pallas_gpu'), ('none_auto_xla', 'fp8_fp8_pallas_gpu')]:
  x, y = load(a), load(b)
  if not (x and y): print(a, b, 'missing'); continue
  agree = sum(u == v for k in x['tokens'] for u, v in zip(x['tokens'][k], y['tokens'][k]))
  first = sum(x['tokens'][k][0] == y['tokens'][k][0] for k in x['tokens'])
  print(f"{a} vs {b}: greedy tokens equal {agree}/1024, first tokens {first}/16, pages {x['num_pages']} vs {y['num_pages']}")
PY
    ;;
  ck8b) [ -f /tmp/llama8b/config.json ] || { t0=$SECONDS; python3 -c "from jaxserve.bench.random_checkpoint import build_random_model as b; b('llama-3.1-8b', '/tmp/llama8b')" > $LOGS/ck8b.log 2>&1; echo "8b checkpoint $((SECONDS-t0)) s"; } ;;
  w*)  # w<quant>:<kv>:<in>:<out>:<n>  offline bench with h100-offline config
    IFS=: read -r q k il ol n <<< "${s#w}"
    t0=$SECONDS
    python3 -m jaxserve.bench.bench_offline --config configs/h100-offline.yaml --model /tmp/llama8b --quantization $q --kv-cache-dtype $k \
      --max-model-len 2176 --num-prompts $n --input-len $il --output-len $ol --no-stream --log-level INFO \
      --set compilation_cache_dir=/tmp/xla --out "$OUT/off_${q}_${k}_${il}_${ol}.json" > $LOGS/$s.log 2>&1
    rc=$?; [ $rc = 0 ] || { echo "$s FAILED"; grep -v "it/s\]\|^E11\|^W11" $LOGS/$s.log | tail -30; }
    echo "$s rc=$rc $((SECONDS-t0)) s: $(grep -E 'output tokens/s|device ms|KV pool|capped' $LOGS/$s.log | grep -v 'it/s' | tr '\n' ' ' | cut -c1-500)" | tee -a "$OUT/summary.txt" ;;
  t*)  # t<quant>:<kv>[:<burst>[:<gemm>[:<qgemm>]]] single stream: 1 prompt 128 in / 512 out, h100.yaml
    IFS=: read -r q k b g qg <<< "${s#t}"; b=${b:-1}; g=${g:-cublas}; qg=${qg:-auto}; tag=${q}_${k}_b${b}_${g}_${qg}
    d=/tmp/dump_t_$tag; rm -rf $d
    XLA_FLAGS="--xla_dump_to=$d --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*forward.* ${TFLAGS:-}" \
    python3 -m jaxserve.bench.bench_offline --config configs/h100.yaml --model /tmp/llama8b --quantization $q --kv-cache-dtype $k \
      --max-num-seqs 8 --max-num-batched-tokens 128 --set "scheduler.seq_buckets=[8]" --set "scheduler.token_buckets=[8,128]" --max-model-len 2176 --num-prompts 1 --input-len 128 --output-len 512 --log-level WARNING \
      --set scheduler.num_scheduler_steps=$b --set gpu_gemm=$g --set quantized_gemm=$qg --set compilation_cache_dir=/tmp/xla --out "$OUT/tpot_$tag.json" > $LOGS/$s.log 2>&1
    rc=$?; [ $rc = 0 ] || { echo "$s FAILED"; grep -v "it/s\]\|^E11\|^W11" $LOGS/$s.log | tail -20; }
    hlo=$(cat $d/*after_optimizations.txt 2>/dev/null)
    echo "$s rc=$rc: $(python3 -c "import json; r=json.load(open('$OUT/tpot_$tag.json')); print('ms/token', round(1e3/r['output_tokens_per_s'], 3), 'host', round(r['host_ms_per_step'], 2), 'device', round(r['device_ms_per_step'], 2), 'steps', r['steps'])") hlo: f8 cublasLt $(grep -c 'matmul\$f8' <<< "$hlo"), cublas $(grep -c 'custom_call_target="__cublas' <<< "$hlo"), triton gemm fusions $(grep -c '"kind":"__triton_gemm"\|__triton_gemm' <<< "$hlo"), bf16 weight-sized fusion outputs $(grep -cE '= bf16\[(6144|4096|28672|14336|57344),(4096|14336)\]\{[0-9,]*\} fusion' <<< "$hlo")" | tee -a "$OUT/summary.txt"
    true ;;
  ak*)  # ak[<tiles>]: the attention kernel by page dtype, same batches, one process each
    tiles=${s#ak}; tiles=${tiles:-default,128:4:5,64:4:5,64:4:2,256:8:2}
    for kv in "" float8_e4m3fn int8; do
      python3 -m investigations.bench_kernels --batches 512,64 --contexts 1500 --no-mixed --device-time --reps 5 \
        --kv-dtype "$kv" --tiles "$tiles" --out "$OUT/attn_${kv:-bf16}.json" > $LOGS/ak_${kv:-bf16}.log 2>&1 || echo "ak ${kv:-bf16} FAILED"
      echo "pages ${kv:-bfloat16}:" | tee -a "$OUT/summary.txt"; grep -E "^decode_|HBM" $LOGS/ak_${kv:-bf16}.log | tail -8 | tee -a "$OUT/summary.txt"
    done ;;
  mm*)  # mm[sweep]: the decode projections' GEMMs, Pallas kernel against XLA (8 rows)
    python3 -m investigations.bench_quantized_matmul --rows 8 ${s#mm} ${MMFLAGS:-} --out "$OUT/qmatmul.json" 2>&1 | grep -v "^E11\|^W11" | tee -a "$OUT/summary.txt" ;;
  p*)  # p<quant>:<kv>:<seqs>[:<gemm>[:<qgemm>]] the decode step's top kernels
    IFS=: read -r q k n g qg <<< "${s#p}"; g=${g:-cublas}; qg=${qg:-auto}
    python3 -m investigations.profile_step --config configs/h100.yaml --model /tmp/llama8b --quantization $q --kv-cache-dtype $k --set gpu_gemm=$g --set quantized_gemm=$qg \
      --max-num-seqs 8 --max-num-batched-tokens 128 --set "scheduler.seq_buckets=[8]" --set "scheduler.token_buckets=[8,128]" --max-model-len 2176 --num-seqs $n --context 512 --trace-top 20 --log-level WARNING --out "$OUT/prof_${q}_${k}_${n}_${g}_${qg}.json" > $LOGS/$s.log 2>&1 || echo "$s FAILED"
    grep -v "it/s\]\|^E11\|^W11" $LOGS/$s.log | tail -30 | tee -a "$OUT/summary.txt" ;;
  o*)  # o<quant>:<kv>:<seqs>:<context> the offline config's decode step's top kernels
    IFS=: read -r q k n c <<< "${s#o}"
    python3 -m investigations.profile_step --config configs/h100-offline.yaml --model /tmp/llama8b --quantization $q --kv-cache-dtype $k \
      --max-model-len 2176 --num-seqs $n --context $c --trace-top 8 --log-level WARNING --out "$OUT/prof_offline_${q}_${k}_${n}_${c}.json" > $LOGS/$s.log 2>&1 || echo "$s FAILED"
    grep -v "it/s\]\|^E11\|^W11" $LOGS/$s.log | tail -16 | tee -a "$OUT/summary.txt" ;;
  bitscheck) python3 -c "from tests.pallas_kernels.test_quantized_matmul import test_fp8_bits_converts_every_float8_value_exactly as t; t(); print('fp8_bits: every float8_e4m3fn value exact on the GPU')" 2>&1 | grep -v "^E11\|^W11" | tail -3 | tee -a "$OUT/summary.txt" ;;
  splits16) sed -i 's/^MAX_SPLITS = 8$/MAX_SPLITS = 16/; s/^TARGET_PROGRAMS = 264 /TARGET_PROGRAMS = 528 /' pallas_kernels/quantized_matmul/gpu.py && grep -E "^(MAX_SPLITS|TARGET_PROGRAMS)" pallas_kernels/quantized_matmul/gpu.py | tr '\n' ' ' | tee -a "$OUT/summary.txt"; echo | tee -a "$OUT/summary.txt" ;;
  xp[0-9]*) sed -i "s/^  return Tiling(block_n, block_k, splits)$/  return Tiling(block_n, block_k, splits, programs=${s#xp} if quantize_x else 0)/" pallas_kernels/quantized_matmul/tiling.py && grep -n "programs=" pallas_kernels/quantized_matmul/tiling.py | tail -1 | tee -a "$OUT/summary.txt" ;;
  fp8bits) sed -i 's/fp8_bits: bool = False/fp8_bits: bool = True/' pallas_kernels/quantized_matmul/gpu.py && echo "fp8_bits on" | tee -a "$OUT/summary.txt" ;;
esac; done
