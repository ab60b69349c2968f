#!/usr/bin/env bash
# bench_rollout --quick with repeated full-length generates per arm (seventh session of 2026-12-02): the
# arm's numbers are the median of the generates after the first, which is reported apart. Question: is
# the unpaired compact-capture arm's 20-39% gap of earlier quick runs a first-generate cost?
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_rollout_reps.sh -> $OUT/rollout_reps.tar
set -uo pipefail
OUT=${OUT:-runs/rollout_reps}
BUDGET=${BUDGET:-420}
DIR="$OUT/rollout_reps"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 150 python3 profiling/prebuild_engine_kernels.py qwen3-30b-a3b:2,64,16384 > "$DIR/build.log" 2>&1
echo "prebuild exit $? (${SECONDS}s)"; grep -E "FAILED|built" "$DIR/build.log" | tail -3
timeout $(( $(left) - 10 )) python3 profiling/bench_rollout.py --quick --generate-reps 4 --time-budget 240 \
  --out "$DIR/rollout_h200_quick_reps.json" > "$DIR/bench.log" 2>&1
echo "bench exit $?"; tail -8 "$DIR/bench.log"
