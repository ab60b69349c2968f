#!/usr/bin/env bash
# One device call (< 8 min) for issue 6's open points:
#  1. the sampling kernel's GPU tests, then the engine's GPU tests with it on (the default),
#     including the pinned guidance pool and the cached block tables;
#  2. racecheck on the sampling kernel (small vocabularies: the 151936-vocab cases make racecheck
#     run for minutes on torch's own reductions), memcheck on two engine tests;
#  3. bench_rollout at batch 512 (prompt 1024, 256 new tokens): BF16 vs NVFP4 vs NVFP4 + compact
#     guidance, with the capture's host memory locked before timing (the RL loop's steady state);
#  4. bench_rollout --long-outputs 32768,131072: decode-step time at the start, middle and end of
#     generations that long, largest batch per mode, BF16 vs NVFP4 vs NVFP4 + guidance.
# Everything goes to $W and comes back as $OUT/rollout_long.tar (the device returns at most 8 files).
# Knobs: SAMPLER_TESTS=0 skips step 1's sampler tests, SANITIZE=0 skips step 2, LONG_PROMPTS
# (default 1024) lists the prompt lengths of step 4, LONG_STEPS its timed steps per point.
# Usage (repo root; the device tool sets OUT; carry .whl and .tkcache):
#   bash profiling/device/run_gpu_checks_rollout_long.sh
set -uo pipefail
OUT=${OUT:-runs/rollout_long}
BUDGET=${BUDGET:-560}
W=${W:-/tmp/rollout_long}
mkdir -p "$OUT" "$W"
trap 'tar -cf "$OUT/rollout_long.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  free -g | head -2; } >> "$W/setup.log" 2>&1

echo "== prebuild ($(left)s left)"
timeout 90 python3 profiling/prebuild_engine_kernels.py "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,256,2560" \
  "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,4,8,32,40" qwen3-30b-a3b:1,2,64,128,256,512,1024,16384 > "$W/build.log" 2>&1
echo "prebuild exit $?"; grep -E "FAILED|built" "$W/build.log" | tail -4

if [ "${SAMPLER_TESTS:-1}" = 1 ]; then
  echo "== sampler kernel tests ($(left)s left)"
  timeout 60 python3 -m pytest tests/gpu/test_sampling_kernel.py -q -rfE -p no:cacheprovider > "$W/sampler_tests.log" 2>&1
  echo "sampler tests exit $?"; tail -3 "$W/sampler_tests.log"
fi

echo "== engine GPU tests, sampling kernel on ($(left)s left)"
timeout 120 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_engine.py tests/rl/test_trainer_quantizers.py \
  tests/rl/test_guidance_capture.py -q -rfE -p no:cacheprovider > "$W/engine_tests.log" 2>&1
echo "engine tests exit $?"; tail -3 "$W/engine_tests.log"

echo "== bench_rollout batch 512 ($(left)s left)"
timeout 110 python3 profiling/bench_rollout.py --prompt-lens 1024 --output-len 256 --batch 512 \
  --arms bf16:off:graphs,nvfp4:off:graphs,nvfp4:compact:graphs --refit-iters 3 \
  --out "$W/rollout_h200_b512.json" > "$W/bench_rollout_b512.log" 2>&1
echo "bench_rollout b512 exit $?"; grep -E "^prompt|x$|%" "$W/bench_rollout_b512.log" | tail -8

for prompt in ${LONG_PROMPTS:-1024}; do
  echo "== bench_rollout long outputs, prompt $prompt ($(left)s left)"
  outputs=32768,131072; [ "$prompt" -gt 1024 ] && outputs=32768
  t=$(( $(left) - ${SANITIZE_S:-110} ))
  timeout "$t" python3 profiling/bench_rollout.py --prompt-lens "" --long-outputs $outputs --long-prompt "$prompt" \
    --long-steps "${LONG_STEPS:-24}" --long-arms bf16:off,nvfp4:off,nvfp4:compact --max-batch 1024 --mem-fraction 0.8 \
    --out "$W/rollout_h200_long_p$prompt.json" > "$W/bench_rollout_long_p$prompt.log" 2>&1
  echo "bench_rollout long exit $?"; grep -E "^long|x |%" "$W/bench_rollout_long_p$prompt.log" | tail -10
done

SAN="compute-sanitizer --report-api-errors no --error-exitcode 9 --print-limit 100"
t=$(( $(left) - 5 ))
if [ "${SANITIZE:-1}" = 1 ] && [ "$t" -gt 20 ]; then
  echo "== racecheck on the sampling kernel, memcheck on two engine tests (${t}s)"
  timeout $(( t / 2 )) $SAN --tool racecheck python3 -m pytest tests/gpu/test_sampling_kernel.py -q -p no:cacheprovider \
    -k "(equal_the_reference and V96) or (ties and (96 or 1000)) or independent" > "$W/sampler_racecheck.log" 2>&1
  echo "racecheck exit $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed" "$W/sampler_racecheck.log" | tail -3
  timeout $(( t / 2 )) $SAN --tool memcheck python3 -m pytest tests/rl/test_engine_gpu.py -q -p no:cacheprovider \
    -k "tiny-kernels and graph_replay_equals_eager and nvfp4" > "$W/engine_memcheck.log" 2>&1
  echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$W/engine_memcheck.log" | tail -3
fi
echo "== done ($(left)s left)"
