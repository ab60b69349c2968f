#!/usr/bin/env bash
# One H200 call: the KV GPU tests on this tree, then the rollout engine's GPU test files three times in one order
# (the order in which test_graph_replay_equals_eager[small-nvfp4-full-False]'s capture was invalidated on
# 2026-12-03), the first time under profiling/capture_probe.py (which line invalidates a capture, GC runs and
# threads during captures), then once more with the cyclic GC off during captures if a plain round failed.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_capture_probe.sh
#   -> $OUT/capture_probe.tar
set -uo pipefail
OUT=${OUT:-runs/capture_probe}
BUDGET=${BUDGET:-540}
DIR="$OUT/capture_probe"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
ENGINE=(tests/rl/test_engine_gpu.py tests/rl/test_engine_kernels.py tests/rl/test_engine.py tests/rl/test_engine_sampler.py)
gpu_tests 150 "$DIR/kv_tests.log" tests/gpu/test_kv_kernels.py
CAPTURE_PROBE_LOG="$DIR/probe_1.log" PYTHONPATH=$PWD/profiling:$PYTHONPATH \
  gpu_tests 120 "$DIR/engine_probe_1.log" -p capture_probe "${ENGINE[@]}"
failed=0
for round in 2 3; do
  gpu_tests 100 "$DIR/engine_plain_$round.log" "${ENGINE[@]}"
  grep -q "^FAILED" "$DIR/engine_plain_$round.log" && failed=1
done
if [ "$failed" = 1 ] && [ "$(left)" -gt 110 ]; then
  CAPTURE_PROBE_GC_OFF=1 CAPTURE_PROBE_LOG="$DIR/probe_gc_off.log" PYTHONPATH=$PWD/profiling:$PYTHONPATH \
    gpu_tests 100 "$DIR/engine_probe_gc_off.log" -p capture_probe "${ENGINE[@]}"
fi
grep -h "first seen\|gc .* during capture" "$DIR"/probe_*.log 2>/dev/null | head -10
