#!/usr/bin/env bash
# The rollout engine after the branch-free block path (quantize and kv_append kernels changed), on
# the H200 (< 7 min): the engine's GPU tests (guidance bit for bit against the reference recorder,
# graph replay against eager), memcheck on the graphed NVFP4 capture test, then bench_rollout's
# paired capture A/B at batch 512 x 1K context (decode-step times, to compare with
# capture_ab_h200_issue_before_enqueue.json). Outputs in $OUT/eng/, tarred to $OUT/eng.tar.
# Usage (repo root; carry .whl and .tkcache, prebuilt by profiling/prebuild_engine_kernels.py):
#   OUT=$OUT bash profiling/device/run_gpu_checks_engine_fast_blocks.sh
set -uo pipefail
OUT=${OUT:-runs/engine_fast_blocks}
BUDGET=${BUDGET:-400}
W="$OUT/eng"; mkdir -p "$W"; trap 'tar -cf "$OUT/eng.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
echo "== engine GPU tests ($(left)s left)"
timeout 150 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py tests/rl/test_engine_kernels.py \
  -q -rfE -p no:cacheprovider > "$W/engine_tests.log" 2>&1
echo "engine tests exit $?"; grep -E "^FAILED" "$W/engine_tests.log" | head -5; tail -1 "$W/engine_tests.log"
echo "== memcheck, graphed NVFP4 engine with capture ($(left)s left)"
timeout 90 compute-sanitizer --report-api-errors no --error-exitcode 9 --print-limit 100 --tool memcheck \
  python3 -m pytest tests/rl/test_engine_gpu.py -q -p no:cacheprovider \
  -k "tiny-kernels and graph_replay_equals_eager and nvfp4 and compact" > "$W/engine_memcheck.log" 2>&1
echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$W/engine_memcheck.log" | tail -2
t=$(( $(left) - 10 ))
if [ "$t" -gt 60 ]; then
  echo "== capture A/B, decode steps at 512 x 1K ($(left)s left)"
  timeout "$t" python3 profiling/bench_rollout.py --prompt-lens "" --capture-ab 512:1024 \
    --out "$W/capture_ab_h200_fast_blocks.json" > "$W/capture_ab.log" 2>&1
  echo "capture A/B exit $?"; grep -E "^capture" "$W/capture_ab.log"
fi
echo "== done ($(left)s left)"
