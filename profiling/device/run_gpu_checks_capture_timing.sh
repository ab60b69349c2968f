#!/usr/bin/env bash
# The guidance copies issued after each step's token read-back (2026-11-29, < 3 min): the engine's
# GPU tests, then the paired capture A/B (decode steps at batch 512 / 1K context, and whole
# generate calls at batch 512, 1K prompts, 256 new tokens), then memcheck on two engine tests.
# Everything goes to $W and comes back as $OUT/capture_timing.tar.
# Usage (repo root; carry .whl and .tkcache): bash profiling/device/run_gpu_checks_capture_timing.sh
set -uo pipefail
OUT=${OUT:-runs/capture_timing}
BUDGET=${BUDGET:-200}
W=${W:-/tmp/capture_timing}
mkdir -p "$OUT" "$W"
trap 'tar -cf "$OUT/capture_timing.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"

echo "== engine GPU tests ($(left)s left)"
timeout 60 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py -q -rfE -p no:cacheprovider \
  > "$W/engine_tests.log" 2>&1
echo "engine tests exit $?"; tail -1 "$W/engine_tests.log"

echo "== capture A/B ($(left)s left)"
timeout 100 python3 profiling/bench_rollout.py --prompt-lens "" --capture-ab 512:1024 \
  --capture-ab-generate 512:1024:256 --ab-generate-rounds 3 --out "$W/capture_ab_h200.json" > "$W/capture_ab.log" 2>&1
echo "capture A/B exit $?"; grep -E "^capture" "$W/capture_ab.log"

t=$(( $(left) - 3 ))
if [ "$t" -gt 20 ]; then
  echo "== memcheck on two engine tests (${t}s)"
  timeout "$t" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 50 \
    python3 -m pytest tests/rl/test_engine_gpu.py -q -p no:cacheprovider \
    -k "tiny-kernels and graph_replay_equals_eager and nvfp4" > "$W/engine_memcheck.log" 2>&1
  echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$W/engine_memcheck.log" | tail -2
fi
echo "== done ($(left)s left)"
