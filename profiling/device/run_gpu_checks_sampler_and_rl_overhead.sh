#!/usr/bin/env bash
# One device call (< 8 min) for what changed after the first H200 runs of 2026-11-29:
#  1. the fused Gumbel-max sampling kernel: its GPU tests, memcheck + racecheck on them, its
#     micro-benchmark (if a test fails, the rest runs with TRACE_KERNELS_SAMPLER=torch);
#  2. the engine's GPU tests with it;
#  3. TRACE step-time overhead (profiling/device/run_rl_experiments_h200.sh with no arms): NVFP4 without
#     guidance vs TRACE with the guidance file written in the background vs read back;
#  4. bench_rollout at batch 512 (prompt 1024, 256 new tokens): BF16 vs NVFP4 vs NVFP4 + capture;
#  5. the tensor-pipe metric names this ncu knows, and the decode ncu run again with them.
# Everything goes to $W and comes back as $OUT/final_checks.tar (the device returns at most 8 files).
# Usage (repo root; the device tool sets OUT; carry .whl and .tkcache):
#   bash profiling/device/run_gpu_checks_sampler_and_rl_overhead.sh
set -uo pipefail
OUT=${OUT:-runs/final_checks}
BUDGET=${BUDGET:-450}
W=${W:-/tmp/final_checks}  # every log and JSON; packed into $OUT/final_checks.tar at the end
mkdir -p "$OUT" "$W"
trap 'tar -cf "$OUT/final_checks.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"  # wheels, PYTHONPATH, JIT cache, left()
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  git log -1 --format='commit %H' 2> /dev/null; } >> "$W/setup.log" 2>&1

echo "== prebuild ($(left)s left)"
timeout 90 python3 profiling/prebuild_engine_kernels.py "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,256,2560" \
  "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,4,8,32,40" qwen3-30b-a3b:2,64,512,16384 > "$W/build.log" 2>&1
echo "prebuild exit $?"; grep -E "FAILED|built" "$W/build.log" | tail -4

echo "== sampler kernel tests ($(left)s left)"
timeout 90 python3 -m pytest tests/gpu/test_sampling_kernel.py -q -rfE -p no:cacheprovider > "$W/sampler_tests.log" 2>&1
rc=$?; echo "sampler tests exit $rc"; tail -3 "$W/sampler_tests.log"
if [ $rc -ne 0 ]; then export TRACE_KERNELS_SAMPLER=torch; echo "sampler kernel off for the rest"; fi

echo "== engine GPU tests ($(left)s left)"
timeout 100 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_engine.py tests/rl/test_trainer_quantizers.py \
  -m gpu -q -rfE -p no:cacheprovider > "$W/engine_tests.log" 2>&1
echo "engine tests exit $?"; tail -3 "$W/engine_tests.log"

echo "== TRACE overhead ($(left)s left)"
t=$(( $(left) - 200 )); [ "$t" -gt 170 ] && t=170
( BUDGET=$t ARMS= MAIN_JOB=0 OUT=$W/rl bash profiling/device/run_rl_experiments_h200.sh ) > "$W/overhead.log" 2>&1
grep -E "exit|median|sft" "$W/overhead.log"

echo "== bench_rollout batch 512 ($(left)s left)"
t=$(( $(left) - 75 ))
timeout "$t" python3 profiling/bench_rollout.py --prompt-lens 1024 --output-len 256 --batch 512 \
  --arms bf16:off:graphs,nvfp4:off:graphs,nvfp4:compact:graphs --refit-iters 3 \
  --out "$W/rollout_h200_b512.json" > "$W/bench_rollout.log" 2>&1
echo "bench_rollout exit $?"; grep -E "^prompt|x$|%" "$W/bench_rollout.log" | tail -8

echo "== sampler micro-benchmark ($(left)s left)"
timeout 40 python3 profiling/bench_sampling.py --out "$W/sampling_h200.json" > "$W/bench_sampling.log" 2>&1
echo "bench_sampling exit $?"; tail -6 "$W/bench_sampling.log"

echo "== ncu tensor-pipe metric names ($(left)s left)"
ncu --query-metrics 2> /dev/null | grep -iE "tensor|gmma" | cut -c1-120 > "$W/ncu_tensor_metrics.txt"
wc -l < "$W/ncu_tensor_metrics.txt"
t=$(( $(left) - 35 ))
if [ "$t" -gt 20 ]; then
  timeout "$t" python3 profiling/ncu.py --ranges 'trace_kernels/moe_gemm_*' --within rollout/decode_step \
    --out-dir "$W/ncu" --name decode_moe -- python3 profiling/ncu.py decode-case --new-tokens 4 > "$W/ncu.log" 2>&1
  echo "ncu exit $?"; grep -E "not collected|^moe_gemm|^kernel" "$W/ncu.log" | cut -c1-200
fi

t=$(( $(left) - 5 ))
if [ "$t" -gt 15 ]; then
  echo "== memcheck + racecheck on the sampler tests (${t}s)"
  timeout $(( t / 2 )) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest tests/gpu/test_sampling_kernel.py -q -p no:cacheprovider -k "not large" > "$W/sampler_memcheck.log" 2>&1
  echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$W/sampler_memcheck.log" | tail -2
  timeout $(( t / 2 )) compute-sanitizer --tool racecheck --error-exitcode 9 \
    python3 -m pytest tests/gpu/test_sampling_kernel.py -q -p no:cacheprovider -k "not large" > "$W/sampler_racecheck.log" 2>&1
  echo "racecheck exit $?"; grep -E "HAZARD|RACECHECK SUMMARY|passed|failed" "$W/sampler_racecheck.log" | tail -2
fi
echo "total ${SECONDS}s"
