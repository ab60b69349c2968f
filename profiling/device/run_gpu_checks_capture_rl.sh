#!/usr/bin/env bash
# One H200 call on the intermittent CUDA-graph capture failure of test_graph_replay_equals_eager[small-nvfp4-full-False]
# (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED at the quantize launch after the MoE gate_up), in the order in which it failed
# on 2026-12-03 (`pytest -m gpu tests/rl`: test_engine.py's GPU tests, then test_engine_gpu.py). KINDS lists the
# rounds, run while time is left: plain (as it failed), probe (under profiling/capture_probe.py: the first traced line
# after which the capture is no longer active, GC runs and threads during captures) and gcoff (the probe with the
# cyclic GC off during captures).
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_capture_rl.sh -> $OUT/capture_rl.tar
set -uo pipefail
OUT=${OUT:-runs/capture_rl}
BUDGET=${BUDGET:-480}
DIR="$OUT/capture_rl"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
round=0
for kind in ${KINDS:-plain probe plain probe gcoff plain gcoff probe gcoff}; do
  round=$((round + 1))
  [ "$(left)" -gt 70 ] || { echo "round $round ($kind) skipped: $(left) s left"; continue; }
  if [ "$kind" = plain ]; then
    gpu_tests 90 "$DIR/${round}_plain.log" -m gpu tests/rl
  else
    CAPTURE_PROBE_GC_OFF=$([ "$kind" = gcoff ] && echo 1 || echo 0) CAPTURE_PROBE_LOG="$DIR/${round}_${kind}_probe.log" \
      PYTHONPATH=$PWD/profiling:$PYTHONPATH gpu_tests 120 "$DIR/${round}_${kind}.log" -p capture_probe -m gpu tests/rl
  fi
done
grep -H "first seen\|gc .* during capture\|ends, status 2" "$DIR"/*_probe.log 2>/dev/null | cut -c1-300 | head -20
