#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants) and decode-attention variants removed the same day (simt, mma on NVFP4
# pages, mma2, mma3, mma4), so it runs as written only on commit 32f5e89 or earlier.
# Confirmation run after the 2026-11-29 A/Bs (< 7 min): the new defaults (NVFP4 decode attention
# mma2_w2s2, guided_fake_quantize v4) under their GPU tests, the engine's GPU tests with the paced
# guidance copies, compute-sanitizer memcheck on the engine, the paired capture A/B (decode steps
# and whole generate calls), and the long-output decode benchmark with the new attention default.
# Everything goes to $W and comes back as $OUT/final.tar.
# Usage (repo root; carry .whl and .tkcache): bash profiling/device/run_gpu_checks_final.sh
set -uo pipefail
OUT=${OUT:-runs/final}
BUDGET=${BUDGET:-420}
W=${W:-/tmp/final}
mkdir -p "$OUT" "$W"
trap 'tar -cf "$OUT/final.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> "$W/setup.log" 2>&1

echo "== KV + guided kernel tests ($(left)s left)"
timeout 40 python3 -m pytest tests/gpu/test_kv_kernels.py -q -rfE -p no:cacheprovider -k "(decode and not simt) or sweep_config" \
  > "$W/kv_tests.log" 2>&1
echo "kv tests exit $?"; tail -1 "$W/kv_tests.log"
timeout 60 python3 -m pytest tests/gpu/test_quantize_kernels.py -q -rfE -p no:cacheprovider -k "guided and not large" \
  > "$W/guided_tests.log" 2>&1
echo "guided tests exit $?"; tail -1 "$W/guided_tests.log"

echo "== engine GPU tests ($(left)s left)"
timeout 75 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_engine.py tests/rl/test_trainer_quantizers.py \
  tests/rl/test_guidance_capture.py -q -rfE -p no:cacheprovider > "$W/engine_tests.log" 2>&1
echo "engine tests exit $?"; tail -1 "$W/engine_tests.log"

echo "== capture A/B ($(left)s left)"
timeout 100 python3 profiling/bench_rollout.py --prompt-lens "" --capture-ab 512:1024 \
  --capture-ab-generate 512:1024:256 --out "$W/capture_ab_h200.json" > "$W/capture_ab.log" 2>&1
echo "capture A/B exit $?"; grep -E "^capture" "$W/capture_ab.log"

echo "== long outputs ($(left)s left)"
t=$(( $(left) - 50 ))
timeout "$t" python3 profiling/bench_rollout.py --prompt-lens "" --long-outputs 32768,131072 --long-prompt 1024 \
  --long-steps 32 --long-arms bf16:off,nvfp4:off --max-batch 1024 --mem-fraction 0.8 \
  --out "$W/rollout_h200_long_p1024.json" > "$W/bench_rollout_long.log" 2>&1
echo "long outputs exit $?"; grep -E "^long|x " "$W/bench_rollout_long.log" | tail -8

t=$(( $(left) - 3 ))
if [ "$t" -gt 20 ]; then
  echo "== memcheck on two engine tests (${t}s)"
  timeout "$t" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 50 \
    python3 -m pytest tests/rl/test_engine_gpu.py -q -p no:cacheprovider \
    -k "tiny-kernels and graph_replay_equals_eager and nvfp4" > "$W/engine_memcheck.log" 2>&1
  echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$W/engine_memcheck.log" | tail -2
fi
echo "== done ($(left)s left)"
