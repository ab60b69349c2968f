#!/usr/bin/env bash
# Guidance capture cost on the H200, paired (< 2.5 min): the engine's GPU tests (guidance bit for
# bit against the reference recorder, graphs, no host sync), then bench_rollout --capture-ab: two
# nvfp4 engines (capture off / compact) alive side by side, decode steps in alternating rounds
# (batch 512 at 1K context, batch 128 at 32K), and whole generate calls alternating (batch 512,
# 1K prompts, 256 new tokens). Outputs in $OUT/cap/, packed into $OUT/cap.tar.
# Usage (repo root; carry .whl and .tkcache): bash profiling/device/run_gpu_checks_capture_ab.sh
set -uo pipefail
OUT=${OUT:-runs/capture_ab}
BUDGET=${BUDGET:-150}
W="$OUT/cap"
mkdir -p "$W"
trap 'tar -cf "$OUT/cap.tar" -C "$W" . && rm -rf "$W"' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"

echo "== engine GPU tests ($(left)s left)"
timeout 60 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py -q -rfE -p no:cacheprovider \
  > "$W/engine_tests.log" 2>&1
echo "engine tests exit $?"; tail -2 "$W/engine_tests.log"

echo "== capture A/B ($(left)s left)"
timeout $(( $(left) - 3 )) python3 profiling/bench_rollout.py --prompt-lens "" --capture-ab 512:1024,128:32768 \
  --capture-ab-generate 512:1024:256 --out "$W/capture_ab_h200.json" > "$W/capture_ab.log" 2>&1
echo "capture A/B exit $?"; grep -E "^capture" "$W/capture_ab.log"
